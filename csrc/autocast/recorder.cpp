#include "recorder.h"

#include <c10/util/Exception.h>

namespace xla_amp {
namespace {

thread_local RecorderPtr tls_recorder;
thread_local Recorder* tls_recorder_raw = nullptr;
thread_local std::vector<std::string> tls_modules;
const std::string kTopLevel;

}  // namespace

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::ScalarType::Undefined: return "";
    default: return c10::toString(t);
  }
}

void Recorder::add(const std::string& module, const std::string& op,
                   CastCategory category, std::vector<at::ScalarType> in_dtypes,
                   at::ScalarType dtype) {
  Key key{module, op, category, std::move(in_dtypes), dtype};
  std::lock_guard<std::mutex> lock(mutex_);
  add_count(std::move(key), 1);
}

void Recorder::add_count(Key key, int64_t count) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    counts_[it->second] += count;
    return;
  }
  index_.emplace(key, keys_.size());
  keys_.push_back(std::move(key));
  counts_.push_back(count);
}

void Recorder::merge_from(const Recorder& other) {
  if (&other == this) return;
  std::vector<Key> keys;
  std::vector<int64_t> counts;
  {
    std::lock_guard<std::mutex> lock(other.mutex_);
    keys = other.keys_;
    counts = other.counts_;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < keys.size(); ++i) add_count(std::move(keys[i]), counts[i]);
}

std::vector<Recorder::Row> Recorder::rows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Row> out;
  out.reserve(keys_.size());
  for (size_t i = 0; i < keys_.size(); ++i) {
    const auto& [module, op, category, in, dtype] = keys_[i];
    std::vector<std::string> in_names;
    for (at::ScalarType t : in) in_names.push_back(dtype_name(t));
    out.emplace_back(module, op,
                     std::string(kCategoryNames[static_cast<size_t>(category)]),
                     std::move(in_names), dtype_name(dtype), counts_[i]);
  }
  return out;
}

Recorder* active_recorder() { return tls_recorder_raw; }

RecorderPtr set_recorder(RecorderPtr rec) {
  RecorderPtr previous = std::move(tls_recorder);
  tls_recorder = std::move(rec);
  tls_recorder_raw = tls_recorder.get();
  return previous;
}

void push_module(std::string name) { tls_modules.push_back(std::move(name)); }

void pop_module() {
  TORCH_CHECK(!tls_modules.empty(), "xla_amp: module stack underflow");
  tls_modules.pop_back();
}

const std::string& current_module() {
  return tls_modules.empty() ? kTopLevel : tls_modules.back();
}

}  // namespace xla_amp
