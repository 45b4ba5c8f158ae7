// Recording the engine's decisions: `xla_amp.autocast(..., record=True)`.
//
// While a recorder is active on a thread, every autocast kernel call on that
// thread adds one count to the row (module, op, category applied, input
// dtypes, dtype the op ran in); the module is the innermost one the Python
// side says is running (push_module/pop_module, from module hooks). With no
// recorder active the kernels pay one thread-local read.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cast_category.h"

namespace xla_amp {

// torch's spelling of a dtype ("bfloat16", "float32", "int64", ...).
std::string dtype_name(at::ScalarType t);

class Recorder {
 public:
  // module, op, category name, input dtypes, dtype ran in, count
  using Row = std::tuple<std::string, std::string, std::string,
                         std::vector<std::string>, std::string, int64_t>;

  void add(const std::string& module, const std::string& op,
           CastCategory category, std::vector<at::ScalarType> in_dtypes,
           at::ScalarType dtype);
  // Adds `other`'s counts to this recorder's rows (a nested recording
  // region's decisions, handed to the enclosing one when it closes).
  void merge_from(const Recorder& other);
  // Rows in the order they were first seen.
  std::vector<Row> rows() const;

 private:
  using Key = std::tuple<std::string, std::string, CastCategory,
                         std::vector<at::ScalarType>, at::ScalarType>;
  mutable std::mutex mutex_;
  void add_count(Key key, int64_t count);  // mutex_ held
  std::map<Key, size_t> index_;  // key -> position in keys_/counts_
  std::vector<Key> keys_;
  std::vector<int64_t> counts_;
};

using RecorderPtr = std::shared_ptr<Recorder>;

// The calling thread's active recorder, or nullptr (the kernels' check).
Recorder* active_recorder();
// Makes `rec` (may be null) the thread's recorder; returns the previous one.
RecorderPtr set_recorder(RecorderPtr rec);

// The thread's module stack, as the recording regions' hooks report it.
void push_module(std::string name);
void pop_module();
const std::string& current_module();

}  // namespace xla_amp
