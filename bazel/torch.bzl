"""@torch: the torch installed in a Python (default: the checkout's .venv).

The repository rule runs bazel/torch_config.py with that Python, which asks
torch itself (torch.utils.cpp_extension.include_paths()/library_paths(),
torch._C._GLIBCXX_USE_CXX11_ABI) and sysconfig (Python's include dir), so
no path is written down here. Another interpreter: --repo_env=XLA_AMP_PYTHON=...

Targets: @torch//:torch (headers, the defines torch's cpp_extension uses,
and the link against libc10, libtorch, libtorch_cpu, libtorch_python),
@torch//:python_headers, and @torch//:build_info.py (xla_amp/_build_info.py's
text: the torch / torch_xla versions, checked when xla_amp is imported).
"""

_BUILD = """
package(default_visibility = ["//visibility:public"])

exports_files(["build_info.py"])

cc_library(
    name = "torch",
    hdrs = glob([{hdr_globs}]),
    includes = [{includes}],
    defines = ["_GLIBCXX_USE_CXX11_ABI={cxx11_abi}"],
    linkopts = [{linkopts}],
)

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)
"""

def _quoted(items):
    return ", ".join(['"%s"' % i for i in items])

def _local_torch_impl(ctx):
    workspace = ctx.path(Label("//:WORKSPACE")).dirname
    python = ctx.os.environ.get("XLA_AMP_PYTHON") or "%s/.venv/bin/python" % workspace
    result = ctx.execute([python, ctx.path(Label("//bazel:torch_config.py"))], quiet = True)
    if result.return_code != 0:
        fail("asking %s for its torch failed (set --repo_env=XLA_AMP_PYTHON to a Python " % python +
             "with torch and torch_xla installed):\n" + result.stderr)
    cfg = json.decode(result.stdout)
    includes = []
    for i, path in enumerate(cfg["include_dirs"]):
        ctx.symlink(path, "include_%d" % i)
        includes.append("include_%d" % i)
    ctx.symlink(cfg["python_include"], "python_include")
    linkopts = ["-L" + d for d in cfg["library_dirs"]]
    linkopts += ["-l" + lib for lib in ("c10", "torch", "torch_cpu", "torch_python")]
    ctx.file("build_info.py", cfg["build_info"])
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", _BUILD.format(
        hdr_globs = _quoted(["%s/**/*.h" % i for i in includes] + ["%s/**/*.hpp" % i for i in includes]),
        includes = _quoted(includes),
        cxx11_abi = cfg["cxx11_abi"],
        linkopts = _quoted(linkopts),
    ))

local_torch = repository_rule(
    implementation = _local_torch_impl,
    environ = ["XLA_AMP_PYTHON"],
    local = True,
)
