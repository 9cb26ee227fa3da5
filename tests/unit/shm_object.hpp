// A POSIX shared-memory object created (and unlinked) by a unit test: what
// an engine's KV pool is to the host backend (test_gpu_host_backend.cpp,
// the cache actor tests).
#pragma once

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvs::test {

class shm_object {
public:
  explicit shm_object(size_t size) : size_(size) {
    static int counter = 0;
    name_ = "/kvs_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<uint8_t*>(p);
  }
  ~shm_object() {
    munmap(data_, size_);
    shm_unlink(name_.c_str());
  }
  shm_object(const shm_object&) = delete;
  shm_object& operator=(const shm_object&) = delete;

  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::vector<uint8_t> snapshot() const { return std::vector<uint8_t>(data_, data_ + size_); }

  /// A pattern that differs per object (seed) and per byte, so a copy from
  /// the wrong place or of the wrong length shows.
  void fill(uint32_t seed) {
    for (size_t i = 0; i < size_; ++i)
      data_[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  }
  /// What an engine can do at any time: shrink the object under our mapping.
  void truncate(size_t size) const {
    const int fd = shm_open(name_.c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
    close(fd);
  }

private:
  std::string name_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

} // namespace kvs::test
