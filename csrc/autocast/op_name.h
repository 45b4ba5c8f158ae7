// The one parser of operator names: "ns::name" or "ns::name.overload".
#pragma once

#include <c10/util/Exception.h>

#include <string>

namespace xla_amp {

struct OpName {
  std::string ns;        // "aten"
  std::string name;      // "conv2d"
  std::string overload;  // "" for the unnamed overload
  std::string qualified() const { return ns + "::" + name; }  // "aten::conv2d"
  std::string name_and_overload() const {  // "conv2d" or "add.Tensor"
    return overload.empty() ? name : name + "." + overload;
  }
};

inline OpName parse_op_name(const std::string& full) {
  const auto sep = full.find("::");
  TORCH_CHECK(sep != std::string::npos,
              "xla_amp: op name '", full, "' lacks a namespace ('ns::op')");
  OpName out;
  out.ns = full.substr(0, sep);
  const std::string rest = full.substr(sep + 2);
  const auto dot = rest.find('.');
  out.name = rest.substr(0, dot);
  out.overload = dot == std::string::npos ? "" : rest.substr(dot + 1);
  return out;
}

}  // namespace xla_amp
