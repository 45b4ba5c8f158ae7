"""Asked by the @torch repository rule (torch.bzl): where the torch of this
Python keeps its headers and libraries, how it was compiled, and the text of
xla_amp/_build_info.py. Prints one JSON object."""
import json
import os
import runpy
import sys
import sysconfig

import torch
from torch.utils import cpp_extension

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
version_check = runpy.run_path(os.path.join(root, "xla_amp", "_version_check.py"))
json.dump({
    "include_dirs": cpp_extension.include_paths(),
    "library_dirs": cpp_extension.library_paths(),
    "python_include": sysconfig.get_paths()["include"],
    "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
    "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
    "build_info": version_check["build_info_text"](
        "bazel", version_check["installed_versions"]()),
    "python": sys.executable,
}, sys.stdout)
