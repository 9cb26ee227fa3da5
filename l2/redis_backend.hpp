// L2 in Redis (standalone or Cluster; l2/redis_client), every node's to
// read and write: objects named and framed by the l2_naming of l2.format,
// read in one pipelined round per fetch.
//
// Usage by salt counts what this node wrote (as LMCache's resp adapter
// counts what it stored): a key another node wrote is not this node's
// usage, and a key Redis expired (l2.redis.ttl) is counted until it is
// erased or found missing by a read.
#pragma once

#include "l2/l2_backend.hpp"
#include "l2/l2_naming.hpp"
#include "l2/redis_client.hpp"

#include <memory>
#include <string>

namespace kvs {

class redis_backend final : public l2_backend {
public:
  redis_backend(redis_options opts, std::string key_prefix,
                std::shared_ptr<const l2_naming> naming);

  const char* medium() const override { return "SHARED"; }
  const char* tier() const override { return "redis"; }
  bool shared() const override { return true; }
  std::string describe() const override;
  std::optional<std::string> name(const l2_key& k) const override {
    return naming_->redis_key(prefix_, k);
  }
  std::vector<bool> contains(const std::vector<std::string>& names) override;
  std::optional<object_key_fields> fields_of(const std::string& name) const override {
    return naming_->redis_fields(prefix_, name);
  }
  std::optional<std::string> name_of(const object_key_fields& f) const override {
    return naming_->redis_key_of(prefix_, f);
  }
  std::vector<bool> put(const std::vector<put_item>& items) override;
  std::vector<bool> get(const std::vector<get_item>& items, std::vector<std::string>& values,
                        std::vector<uint32_t>& skip) override;
  size_t erase(const std::vector<std::string>& names) override;
  /// A Redis every node shares is not one node's to empty: nothing.
  size_t clear() override { return 0; }
  l2_listing list(uint64_t offset, uint64_t limit) const override;
  void figures(const l2_figure_sink& out) const override;
  std::vector<std::string> new_faults() override;

  redis_client& client() { return *client_; }

private:
  std::unique_ptr<redis_client> client_;
  redis_options opts_;
  std::string prefix_;
  std::shared_ptr<const l2_naming> naming_;
  uint64_t rejected_ = 0;        ///< values that failed their check
  std::string last_error_;       ///< logged once per distinct error
};

} // namespace kvs
