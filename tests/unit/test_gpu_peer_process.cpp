// Who is at the other end of a connection, and what it holds (gpu/peer_process.hpp).
#include "gpu/peer_process.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

using namespace kvs;

TEST_CASE("gRPC peer names: ipv4, ipv6 (brackets escaped or not), others none") {
  auto v4 = parse_grpc_peer("ipv4:127.0.0.1:40123");
  REQUIRE(v4);
  CHECK(v4->ip == "127.0.0.1");
  CHECK(v4->port == 40123);
  auto v6 = parse_grpc_peer("ipv6:%5B::1%5D:555");
  REQUIRE(v6);
  CHECK(v6->ip == "::1");
  CHECK(v6->port == 555);
  CHECK(parse_grpc_peer("ipv6:[::1]:556")->port == 556);
  CHECK_FALSE(parse_grpc_peer("unix:/run/kvs.sock"));
  CHECK_FALSE(parse_grpc_peer("ipv4:127.0.0.1:0"));
  CHECK_FALSE(parse_grpc_peer("ipv4:127.0.0.1:99999"));
  CHECK_FALSE(parse_grpc_peer("ipv6:::1:5")); // no brackets
}

namespace {

struct loopback_pair {
  int listener = -1, client = -1, server = -1;
  tcp_endpoint client_end;
  loopback_pair() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(listener, 1) == 0);
    socklen_t len = sizeof a;
    getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    client = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    server = accept(listener, nullptr, nullptr);
    REQUIRE(server >= 0);
    sockaddr_in c{};
    len = sizeof c;
    getsockname(client, reinterpret_cast<sockaddr*>(&c), &len);
    client_end = tcp_endpoint{"127.0.0.1", ntohs(c.sin_port)};
  }
  ~loopback_pair() {
    for (int fd : {listener, client, server})
      if (fd >= 0)
        close(fd);
  }
};

} // namespace

TEST_CASE("a loopback connection: established while open, its socket's owner and process") {
  loopback_pair p;
  CHECK(tcp_remote_established(p.client_end) == true);
  CHECK(tcp_peer_connected("ipv4:127.0.0.1:" + std::to_string(p.client_end.port)) == true);
  auto owner = tcp_local_socket(p.client_end);
  REQUIRE(owner);
  CHECK(owner->uid == geteuid());
  CHECK(pid_of_socket(owner->inode) == getpid());
  // The client end closes: the server's side is no longer ESTABLISHED.
  close(p.client);
  p.client = -1;
  CHECK(tcp_remote_established(p.client_end) == false);
}

TEST_CASE("possession: an object open or mapped by the process, not one it never opened") {
  const std::string mapped = "/kvs_pp_mapped_" + std::to_string(getpid());
  const std::string other = "/kvs_pp_other_" + std::to_string(getpid());
  int fd = shm_open(mapped.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 4096) == 0);
  void* m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(m != MAP_FAILED);
  CHECK(process_holds_shm(getpid(), mapped) == true); // open and mapped
  close(fd);
  CHECK(process_holds_shm(getpid(), mapped.substr(1)) == true); // mapped only
  // Another process made it; this one never opened it.
  pid_t child = fork();
  if (child == 0) {
    int o = shm_open(other.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    _exit(o >= 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(process_holds_shm(getpid(), other) == false);
  CHECK_FALSE(process_holds_shm(0, other));
  munmap(m, 4096);
  CHECK(process_holds_shm(getpid(), mapped) == false);
  shm_unlink(mapped.c_str());
  shm_unlink(other.c_str());
}
