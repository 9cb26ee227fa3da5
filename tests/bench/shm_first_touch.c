// shm_first_touch: what an engine pays to write 256 MiB extents of a fresh
// shared-memory object through its own mapping, by how the sidecar prepared
// them (issue #46, cache.l1_arena_ahead). A "client" mapping writes each
// extent with `threads` threads (LMCache's bench CLI gathers with torch's
// two); a "server" mapping of the same object prepares it:
//   none     nothing: the client's faults allocate and zero (LMCache's L1)
//   reserve  posix_fallocate before the write (kvsidecar's claim)
//   fault    reserve, then MADV_POPULATE_WRITE through the server's mapping
//   ahead    reserve + fault the *next* extent on a nice-19 thread while
//            the client writes this one (cache.l1_arena_ahead)
// Prints the mean per extent of prep + write (what a store step costs).
//   gcc -O2 -pthread tests/bench/shm_first_touch.c -o /tmp/shm_first_touch
//   /tmp/shm_first_touch 2 none reserve fault ahead
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define EXT (256ul << 20)
#define EXTENTS 8
#define STEP (2ul << 20)

static char *src, *client, *server;
static int fd, threads;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct part { char *dst; size_t n; };
static void *write_part(void *x) {
  struct part *p = x;
  memcpy(p->dst, src, p->n);
  return NULL;
}
static void client_write(char *dst) {
  pthread_t t[16];
  struct part p[16] = {{0}};
  for (int i = 0; i < threads; ++i) {
    p[i].dst = dst + EXT / threads * i;
    p[i].n = EXT / threads;
    if (i) pthread_create(&t[i], NULL, write_part, &p[i]);
  }
  write_part(&p[0]);
  for (int i = 1; i < threads; ++i) pthread_join(t[i], NULL);
}
static void reserve(size_t k) { posix_fallocate(fd, (off_t)(k * EXT), (off_t)EXT); }
static void fault_in(size_t k) {
  for (size_t o = 0; o < EXT; o += STEP) madvise(server + k * EXT + o, STEP, MADV_POPULATE_WRITE);
}
static void *ahead(void *x) {
  setpriority(PRIO_PROCESS, 0, 19); // this thread only (Linux)
  reserve((size_t)x);
  fault_in((size_t)x);
  return NULL;
}

static double run(const char *mode) {
  fd = shm_open("/kvs_shm_first_touch", O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)(EXT * EXTENTS)) != 0) { perror("shm"); exit(1); }
  server = mmap(NULL, EXT * EXTENTS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  client = mmap(NULL, EXT * EXTENTS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (server == MAP_FAILED || client == MAP_FAILED) { perror("mmap"); exit(1); }
  const int is_ahead = !strcmp(mode, "ahead");
  if (is_ahead) { reserve(0); fault_in(0); } // ready before the first store
  pthread_t bg = 0;
  double sum = 0;
  for (size_t k = 0; k < EXTENTS; ++k) {
    const double t0 = now_ms();
    if (!strcmp(mode, "reserve") || !strcmp(mode, "fault")) reserve(k);
    if (!strcmp(mode, "fault")) fault_in(k);
    if (is_ahead) {
      if (bg) pthread_join(bg, NULL);
      bg = 0;
      if (k + 1 < EXTENTS) pthread_create(&bg, NULL, ahead, (void *)(k + 1));
    }
    client_write(client + k * EXT);
    sum += now_ms() - t0;
  }
  if (bg) pthread_join(bg, NULL);
  munmap(server, EXT * EXTENTS);
  munmap(client, EXT * EXTENTS);
  close(fd);
  shm_unlink("/kvs_shm_first_touch");
  return sum / EXTENTS;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s THREADS MODE... (none reserve fault ahead)\n", argv[0]);
    return 2;
  }
  threads = atoi(argv[1]);
  if (threads < 1 || threads > 16) { fprintf(stderr, "THREADS: 1 to 16\n"); return 2; }
  src = malloc(EXT);
  memset(src, 1, EXT);
  for (int i = 2; i < argc; ++i)
    printf("%d writer thread(s), %-8s %.1f ms per 256 MiB extent (prep + write)\n", threads,
           argv[i], run(argv[i]));
  return 0;
}
