import pytest

from triforce.kernels import cpu


@pytest.fixture(params=cpu.available_levels() or [None])
def level(request, monkeypatch):
    """Runs a test with the kernels of each instruction-set level this CPU has (the levels that
    TRIFORCE_CPU_ISA can pick), so a machine with AVX-512 tests the AVX2 kernels as well."""
    if request.param is None:
        pytest.skip("not an x86-64 CPU with AVX2 and FMA")
    try:
        ext = cpu.extension(request.param)
    except Exception as exc:  # no compiler here: the kernels cannot be tested, and torch's paths run
        pytest.skip(f"the {request.param} kernels did not build: {str(exc).splitlines()[0]}")
    monkeypatch.setattr(cpu, "loaded_kernels", lambda: (request.param, ext))
    monkeypatch.setattr(cpu, "isa_level", lambda: request.param)  # native_bf16() answers as that CPU would
    cpu.has_amx.cache_clear()
    yield request.param
    cpu.has_amx.cache_clear()
