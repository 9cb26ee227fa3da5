// replay_ring: what a replay request gets for each start seq.
#include "relay/replay_ring.hpp"

#include <doctest/doctest.h>

using namespace kvs;

namespace {
encoded_batch batch(uint64_t seq) {
  return {seq, std::make_shared<const std::string>("p" + std::to_string(seq))};
}
std::vector<uint64_t> seqs(const std::vector<encoded_batch>& bs) {
  std::vector<uint64_t> out;
  for (auto& b : bs)
    out.push_back(b.seq);
  return out;
}
} // namespace

TEST_CASE("replay ring keeps the last N batches") {
  replay_ring r{3};
  CHECK(r.from(0).empty());
  for (uint64_t s = 0; s < 5; ++s)
    r.push(batch(s));
  CHECK(r.size() == 3);
  CHECK(r.oldest_seq() == 2);
  CHECK(r.newest_seq() == 4);
  CHECK(seqs(r.from(0)) == std::vector<uint64_t>{2, 3, 4}); // older start: from the oldest
  CHECK(seqs(r.from(3)) == std::vector<uint64_t>{3, 4});
  CHECK(seqs(r.from(4)) == std::vector<uint64_t>{4});
  CHECK(r.from(5).empty()); // beyond the newest: nothing (then the end marker)
  CHECK(*r.from(3)[0].payload == "p3");
}

TEST_CASE("replay ring resets when the sequence restarts") {
  replay_ring r{4};
  r.push(batch(7));
  r.push(batch(8));
  r.push(batch(0));
  CHECK(r.size() == 1);
  CHECK(r.oldest_seq() == 0);
}

TEST_CASE("replay ring keeps at most max_bytes of payload, oldest first out") {
  replay_ring r{100, 10}; // payloads "p0".."p9" are 2 bytes each: 5 fit
  for (uint64_t s = 0; s < 8; ++s)
    r.push(batch(s));
  CHECK(r.size() == 5);
  CHECK(r.bytes() == 10);
  CHECK(seqs(r.from(0)) == std::vector<uint64_t>{3, 4, 5, 6, 7});
  // A batch larger than the bound is still kept, alone.
  r.push({8, std::make_shared<const std::string>(std::string(50, 'x'))});
  CHECK(r.size() == 1);
  CHECK(r.oldest_seq() == 8);
  CHECK(r.bytes() == 50);
}

TEST_CASE("a zero-capacity ring keeps nothing") {
  replay_ring r{0};
  r.push(batch(0));
  CHECK(r.empty());
  CHECK(r.from(0).empty());
}
