#include "region.h"

#include <vector>

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

namespace xla_amp {
namespace {

struct Saved {
  bool enabled;
  at::ScalarType dtype;
  bool cache_enabled;
};

thread_local std::vector<Saved> tls_saved;

}  // namespace

void enter_region(PolicyPtr table, bool enabled, at::ScalarType dtype,
                  bool cache_enabled) {
  namespace ac = at::autocast;
  tls_saved.push_back({ac::is_autocast_enabled(at::kXLA),
                       ac::get_autocast_dtype(at::kXLA),
                       ac::is_autocast_cache_enabled()});
  push_thread_policy(std::move(table));
  ac::set_autocast_enabled(at::kXLA, enabled);
  ac::set_autocast_dtype(at::kXLA, dtype);
  ac::increment_nesting();
  ac::set_autocast_cache_enabled(cache_enabled);
}

void exit_region() {
  namespace ac = at::autocast;
  TORCH_CHECK(!tls_saved.empty(),
              "xla_amp: autocast region exit without a matching enter");
  const Saved saved = tls_saved.back();
  tls_saved.pop_back();
  if (ac::decrement_nesting() == 0) ac::clear_cache();
  ac::set_autocast_enabled(at::kXLA, saved.enabled);
  ac::set_autocast_dtype(at::kXLA, saved.dtype);
  ac::set_autocast_cache_enabled(saved.cache_enabled);
  pop_thread_policy();
}

}  // namespace xla_amp
