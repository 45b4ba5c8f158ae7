"""rules_cc's public names, bound to Bazel's native rules.

Bazel 4.2.3 (Debian's bazel-bootstrap) loads @rules_cc//cc:defs.bzl from its
own C++ toolchain setup and would download rules_cc; Debian's bazel-rules-cc
is too new for it (it needs use_cpp_toolchain). In Bazel 4 these rules are
native anyway, so this offline stand-in only forwards to them.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_proto_library = native.cc_proto_library
cc_shared_library = getattr(native, "cc_shared_library", None)
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
fdo_prefetch_hints = native.fdo_prefetch_hints
fdo_profile = native.fdo_profile
objc_import = native.objc_import
objc_library = native.objc_library
