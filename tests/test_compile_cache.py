"""The preflight's compile cache (sweeps/preflight/compile_cache.py), on CPU-compiled programs: what it stores,
when it answers."""

import gzip
import os

import jax
import jax.numpy as jnp
import pytest

from sweeps.preflight import compile_cache


class CountingLowered:
    """A lowered JAX program whose compiles are counted (and may be made to fail)."""

    def __init__(self, lowered, error: Exception | None = None):
        self.lowered, self.error, self.compiles = lowered, error, 0

    def as_text(self):
        return self.lowered.as_text()

    def compile(self):
        self.compiles += 1
        if self.error is not None:
            raise self.error
        return self.lowered.compile()


def lowered(size=64):
    return jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0)).lower(jax.ShapeDtypeStruct((size, size), jnp.float32))


def never_out_of_memory(error):
    return False


def test_a_stored_compile_answers_for_the_same_program_without_compiling(tmp_path):
    first = CountingLowered(lowered())
    compiled = compile_cache.CompileCache(str(tmp_path)).compile(first, "v5e:2x2", never_out_of_memory)
    assert first.compiles == 1 and len(os.listdir(tmp_path)) == 1

    again = CountingLowered(lowered())  # traced and lowered afresh: the same text
    cache = compile_cache.CompileCache(str(tmp_path))
    cached = cache.compile(again, "v5e:2x2", never_out_of_memory)
    assert again.compiles == 0 and cache.hits == 1
    assert isinstance(cached, compile_cache.CachedCompile)
    assert cached.as_text() == compiled.as_text()
    stats = compiled.memory_analysis()
    for name in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes"):
        assert getattr(cached.memory_analysis(), name) == getattr(stats, name)


@pytest.mark.parametrize("change", ["program", "topology"])
def test_another_program_or_slice_is_compiled(tmp_path, change):
    cache = compile_cache.CompileCache(str(tmp_path))
    cache.compile(CountingLowered(lowered()), "v5e:2x2", never_out_of_memory)
    other = CountingLowered(lowered(size=32 if change == "program" else 64))
    cache.compile(other, "v5e:2x2" if change == "program" else "v5e:2x4", never_out_of_memory)
    assert other.compiles == 1 and cache.hits == 0 and len(os.listdir(tmp_path)) == 2


def test_out_of_memory_is_stored_and_raised_again_other_errors_are_not(tmp_path):
    is_oom = lambda error: "RESOURCE_EXHAUSTED" in str(error)  # noqa: E731
    cache = compile_cache.CompileCache(str(tmp_path))
    oom = CountingLowered(lowered(), RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory; Used 20.5G of 15.75G hbm"))
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        cache.compile(oom, "v5e:2x2", is_oom)
    again = CountingLowered(lowered())
    with pytest.raises(compile_cache.CachedCompileError) as raised:
        cache.compile(again, "v5e:2x2", is_oom)
    assert again.compiles == 0 and str(raised.value) == str(oom.error)
    assert type(raised.value).__name__ == "RuntimeError"  # reported as the compiler's error was

    broken = CountingLowered(lowered(size=16), RuntimeError("INTERNAL: the compiler crashed"))
    with pytest.raises(RuntimeError, match="INTERNAL"):
        cache.compile(broken, "v5e:2x2", is_oom)
    retried = CountingLowered(lowered(size=16))
    cache.compile(retried, "v5e:2x2", is_oom)
    assert retried.compiles == 1


def test_an_unreadable_entry_is_compiled_again_and_replaced(tmp_path):
    cache = compile_cache.CompileCache(str(tmp_path))
    cache.compile(CountingLowered(lowered()), "v5e:2x2", never_out_of_memory)
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(gzip.compress(b'{"hlo_te'))  # cut short, as by a full disk
    again = CountingLowered(lowered())
    cache.compile(again, "v5e:2x2", never_out_of_memory)
    assert again.compiles == 1
    assert "hlo_text" in gzip.decompress(entry.read_bytes()).decode()


def test_no_directory_compiles_every_time(tmp_path):
    cache = compile_cache.CompileCache(None)
    for _ in range(2):
        spy = CountingLowered(lowered())
        cache.compile(spy, "v5e:2x2", never_out_of_memory)
        assert spy.compiles == 1


def test_the_directory_comes_from_the_variable_or_the_user_cache(tmp_path):
    assert compile_cache.default_directory(environ={"SCALING_PREFLIGHT_CACHE": "off"}) is None
    assert compile_cache.default_directory(environ={"SCALING_PREFLIGHT_CACHE": str(tmp_path)}) == str(tmp_path)
    assert compile_cache.default_directory(environ={"XDG_CACHE_HOME": "/x"}) == os.path.join("/x", "scaling", "preflight")
    # --compile-cache wins over the variable.
    assert compile_cache.default_directory("off", environ={"SCALING_PREFLIGHT_CACHE": str(tmp_path)}) is None
    assert compile_cache.default_directory("/y", environ={"SCALING_PREFLIGHT_CACHE": "off"}) == "/y"
