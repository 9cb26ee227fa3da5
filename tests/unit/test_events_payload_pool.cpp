// payload_pool: large payloads come back to the pool when their last
// reference goes and the next payload of the class reuses that very buffer;
// what it keeps never exceeds its bound; small payloads are never pooled.
#include "events_wire/kv_event_payload_pool.hpp"

#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

using namespace kvs;

namespace {
std::string bytes(size_t n, char c) {
  return std::string(n, c);
}
} // namespace

TEST_CASE("a returned buffer is reused by the next payload of its class") {
  auto pool = payload_pool::make(1 << 20, 16 << 10);
  const auto a = bytes(62800, 'a');
  auto p = pool->copy(a.data(), a.size());
  CHECK(*p == a);
  CHECK(p->capacity() == pool->class_capacity(a.size()));
  CHECK(pool->allocated() == 1);
  const char* buffer = p->data();
  p.reset();
  CHECK(pool->kept_bytes() == pool->class_capacity(a.size()));

  // A slightly smaller payload of the same class: the same memory, its own bytes.
  const auto b = bytes(62000, 'b');
  auto q = pool->copy(b.data(), b.size());
  CHECK(q->data() == buffer);
  CHECK(*q == b);
  CHECK(pool->reused() == 1);
  CHECK(pool->kept_bytes() == 0);
}

TEST_CASE("size classes waste at most a sixteenth") {
  auto pool = payload_pool::make(1 << 20, 16 << 10);
  for (size_t n : {size_t{16 << 10}, size_t{16385}, size_t{40000}, size_t{65535}, size_t{65536},
                   size_t{1000001}, size_t{64} << 20}) {
    const size_t cap = pool->class_capacity(n);
    CAPTURE(n);
    CHECK(cap >= n);
    CHECK(cap - n <= n / 16);
    CHECK(pool->class_capacity(cap) == cap); // a class's capacity is its own class
  }
}

TEST_CASE("a payload of another class gets a new buffer; the next class up is taken") {
  auto pool = payload_pool::make(1 << 20, 16 << 10);
  const auto big = bytes(100000, 'x');
  auto p = pool->copy(big.data(), big.size());
  p.reset();
  // 20,000 bytes is far below 100,000's class: not reused.
  const auto small = bytes(20000, 'y');
  auto q = pool->copy(small.data(), small.size());
  CHECK(pool->reused() == 0);
  CHECK(pool->allocated() == 2);
  // One class below 100,000's: the kept buffer (one class up) serves it.
  const size_t step = size_t{1} << (16 - 4);
  const auto near = bytes(pool->class_capacity(big.size()) - step - 1, 'z');
  auto r = pool->copy(near.data(), near.size());
  CHECK(pool->reused() == 1);
  CHECK(*r == near);
  // In use, it counts with its own (larger) capacity: returned, it is kept
  // only if that fits, and the bound sees all of it.
  q.reset();
  r.reset();
  CHECK(pool->kept_bytes()
        == pool->class_capacity(big.size()) + pool->class_capacity(small.size()));
}

TEST_CASE("a buffer taken from the next class counts as its own capacity against the bound") {
  // Bound: 200,000 bytes. A payload one class below (98,304) takes the
  // kept 102,400-byte buffer; another of its class (98,304) must then not
  // be kept beside it: 102,400 + 98,304 is over the bound (counted as
  // 98,304 + 98,304 it would seem to fit).
  const size_t big_cap = 102400;
  auto pool = payload_pool::make(200000, 16 << 10);
  const auto big = bytes(100000, 'x');
  REQUIRE(pool->class_capacity(big.size()) == big_cap);
  pool->copy(big.data(), big.size()).reset(); // kept: 102,400
  const auto near = bytes(big_cap - 4096 - 1, 'z'); // class 98,304
  auto r = pool->copy(near.data(), near.size()); // takes the 102,400 one
  CHECK(pool->reused() == 1);
  auto other = pool->copy(near.data(), near.size()); // new: 98,304
  other.reset(); // 102,400 in use + 98,304 > 200,000: freed
  CHECK(pool->kept_bytes() == 0);
  r.reset();
  CHECK(pool->kept_bytes() == big_cap);
}

TEST_CASE("what the pool keeps is bounded; beyond it returned buffers are freed") {
  const size_t n = 64 << 10;
  auto pool = payload_pool::make(3 * n, 16 << 10);
  const auto a = bytes(n, 'a');
  std::vector<std::shared_ptr<const std::string>> held;
  for (int i = 0; i < 10; ++i)
    held.push_back(pool->copy(a.data(), a.size()));
  held.clear();
  CHECK(pool->kept_bytes() == 3 * n);
  for (int i = 0; i < 10; ++i)
    held.push_back(pool->copy(a.data(), a.size()));
  CHECK(pool->reused() == 3);
  CHECK(pool->allocated() == 17);
  CHECK(pool->kept_bytes() == 0);
}

TEST_CASE("kept and in use together stay within the bound") {
  const size_t n = 64 << 10;
  auto pool = payload_pool::make(3 * n, 16 << 10);
  const auto a = bytes(n, 'a');
  std::vector<std::shared_ptr<const std::string>> held;
  for (int i = 0; i < 4; ++i) // one more than the bound: taking is never refused
    held.push_back(pool->copy(a.data(), a.size()));
  held.pop_back(); // three still in use: nothing may be kept
  CHECK(pool->kept_bytes() == 0);
  held.pop_back(); // two in use, one kept
  CHECK(pool->kept_bytes() == n);
  held.clear();
  CHECK(pool->kept_bytes() == 3 * n);
}

TEST_CASE("a buffer that grew while in use counts what it was taken as, and is not kept") {
  const size_t n = 64 << 10;
  auto pool = payload_pool::make(n + n / 2, 16 << 10);
  const auto a = bytes(n, 'a');
  auto held = pool->copy(a.data(), a.size()); // in use all along: n
  auto grown = pool->take(n);
  grown->assign(3 * n, 'g'); // its owner outgrew it: reallocated
  grown.reset();             // not a class's buffer any more: freed
  CHECK(pool->kept_bytes() == 0);
  // Another n-byte payload returned while `held` is still in use: kept +
  // in use would be 2n, over the bound (had the grown buffer's return
  // taken 3n off what is in use, this one would have been kept).
  pool->copy(a.data(), a.size()).reset();
  CHECK(pool->kept_bytes() == 0);
  held.reset();
  CHECK(pool->kept_bytes() == n);
}

TEST_CASE("payloads below the pooled size are plain copies, never kept") {
  auto pool = payload_pool::make(1 << 20, 16 << 10);
  const auto s = bytes(4000, 's');
  auto p = pool->copy(s.data(), s.size());
  CHECK(*p == s);
  p.reset();
  CHECK(pool->kept_bytes() == 0);
  CHECK(pool->allocated() == 0);
  auto empty = pool->copy(nullptr, 0);
  CHECK(empty->empty());
}

TEST_CASE("payloads outlive the pool's owner and come back from other threads") {
  std::vector<std::shared_ptr<const std::string>> held;
  std::weak_ptr<payload_pool> watch;
  {
    auto pool = payload_pool::make(8 << 20, 16 << 10);
    watch = pool;
    const auto a = bytes(30000, 'a');
    for (int i = 0; i < 100; ++i)
      held.push_back(pool->copy(a.data(), a.size()));
  }
  // The payloads keep the pool alive; dropping them on two threads returns
  // them concurrently, then the pool goes with the last one.
  CHECK(!watch.expired());
  CHECK(watch.lock()->kept_bytes() == 0);
  std::vector<std::shared_ptr<const std::string>> half(held.begin() + 50, held.end());
  held.resize(50);
  std::thread t{[&half] { half.clear(); }};
  held.clear();
  t.join();
  CHECK(watch.expired());
}
