"""The argument-forms sweep's own cases (tests/support/argument_forms.py):
ops no policy lists, Python's operators with a number, and ops whose plain
call does not repeat bit for bit."""

# Ops no built-in policy lists that user code calls with Python numbers;
# with another policy compiled, their kernels are registered and pass through.
RULELESS = ("aten::sub.Tensor", "aten::rsub.Tensor", "aten::remainder.Tensor",
            "aten::fmod.Tensor", "aten::eq.Tensor", "aten::lt.Tensor",
            "aten::maximum", "aten::where.self", "aten::clamp.Tensor",
            "aten::lerp.Tensor", "aten::floor_divide", "aten::masked_fill.Tensor")


# Python's operators with a number (their kernels once raised on these)
OPERATORS = {
    "py::t * 2": lambda t: t * 2, "py::0.5 * t": lambda t: 0.5 * t,
    "py::t / 2": lambda t: t / 2, "py::2 / t": lambda t: 2 / t,
    "py::t + 1": lambda t: t + 1, "py::1 - t": lambda t: 1 - t,
    "py::t - 0.5": lambda t: t - 0.5, "py::t ** 2": lambda t: t ** 2,
    "py::2 ** t": lambda t: 2 ** t, "py::t // 2": lambda t: t // 2,
    "py::t % 2": lambda t: t % 2, "py::t > 0": lambda t: t > 0,
}


# Ops whose plain call does not repeat bit for bit: compared to float32's
# rounding. linalg_lstsq (LAPACK gelsy): two identical calls on the torch 2.9
# stand-in differ in the last bits of the solution.
UNREPEATABLE = {"aten::linalg_lstsq"}
