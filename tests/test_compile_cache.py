"""`use_compile_cache` and the commands' --compile-cache flag: which folder JAX's
persistent compilation cache ends up in, and what is left alone. (That a command's run
writes its epoch program there: test_train.py's default CLI run.)"""

import warnings

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

from zerognn_jax import CompileCacheWarning, use_compile_cache
from zerognn_jax._src.training import compile_cache
from zerognn_jax.cli import build_parser
from zerognn_jax.cli.flags import use_compile_cache_flag

SETTINGS = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size",
            "jax_persistent_cache_min_compile_time_secs", "jax_enable_compilation_cache")


@pytest.fixture(autouse=True)
def jax_settings():
    """JAX's cache settings as conftest left them, put back after each test."""
    before = {name: getattr(jax.config, name) for name in SETTINGS}
    yield before
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def test_a_folder_given_is_created_bounded_and_used(tmp_path, jax_settings):
    folder = tmp_path.resolve() / "a" / "b"
    jax.config.update("jax_compilation_cache_max_size", -1)
    assert use_compile_cache(folder, max_gib=0.5) == folder
    assert folder.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(folder)
    assert jax.config.jax_compilation_cache_max_size == 2**29
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.2


def test_settings_the_user_gave_jax_are_kept_and_its_own_replaced(tmp_path):
    jax.config.update("jax_compilation_cache_max_size", 12345)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 10.0)
    use_compile_cache(tmp_path)
    assert jax.config.jax_compilation_cache_max_size == 12345
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 10.0
    jax.config.update("jax_compilation_cache_max_size", -1)
    use_compile_cache(tmp_path / "a")
    use_compile_cache(tmp_path / "b", max_gib=16)  # a second call's bound replaces the first
    assert jax.config.jax_compilation_cache_max_size == 16 * 2**30
    use_compile_cache(tmp_path, max_gib=None)  # unbounded, as asked
    assert jax.config.jax_compilation_cache_max_size == -1


def test_entries_left_half_written_are_removed(tmp_path):
    whole, cut = tmp_path / "jit_run-1-cache", tmp_path / "jit_run-2-cache"
    for path in (whole, tmp_path / "jit_run-1-atime", cut):
        path.write_bytes(b"x")
    use_compile_cache(tmp_path)
    assert whole.exists() and not cut.exists()


def test_one_folder_has_one_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert use_compile_cache("rel") == tmp_path.resolve() / "rel"
    assert jax.config.jax_compilation_cache_dir == str(tmp_path.resolve() / "rel")


def test_no_folder_keeps_jax_s_own_else_takes_the_default(tmp_path, monkeypatch,
                                                          jax_settings):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    assert use_compile_cache() == tmp_path / "jax"
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path.resolve() / "xdg"))
    expected = tmp_path.resolve() / "xdg" / "zerognn-jax" / "xla"
    assert compile_cache.default_cache_dir() == expected
    assert use_compile_cache() == expected and expected.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(expected)


def test_a_cache_turned_off_stays_off(tmp_path, jax_settings):
    jax.config.update("jax_enable_compilation_cache", False)
    assert use_compile_cache() is None
    with pytest.warns(CompileCacheWarning, match="turned off"):
        assert use_compile_cache(tmp_path / "c") is None
    assert not (tmp_path / "c").exists()
    assert jax.config.jax_compilation_cache_dir == jax_settings["jax_compilation_cache_dir"]


def test_a_folder_that_cannot_be_made_warns_and_changes_nothing(tmp_path, jax_settings):
    (tmp_path / "file").write_text("not a folder")
    with pytest.warns(CompileCacheWarning, match="cannot be used") as caught:
        assert use_compile_cache(tmp_path / "file" / "cache") is None
    assert str(tmp_path / "file" / "cache") in str(caught[0].message)
    assert jax.config.jax_compilation_cache_dir == jax_settings["jax_compilation_cache_dir"]


def test_a_loop_of_links_warns_too(tmp_path, jax_settings):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.warns(CompileCacheWarning, match="cannot be used") as caught:
        assert use_compile_cache(tmp_path / "a" / "x") is None
    assert caught[0].filename == __file__  # the caller's line, not the library's
    assert jax.config.jax_compilation_cache_dir == jax_settings["jax_compilation_cache_dir"]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_bound_that_is_not_positive_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match=f"max_gib must be positive.*{bad}"):
        use_compile_cache(tmp_path, max_gib=bad)


def test_the_flag_names_a_folder_or_none_and_defaults_to_the_environment(tmp_path,
                                                                         monkeypatch,
                                                                         jax_settings):
    args = build_parser().parse_args(["train", "--compile-cache", "None"])
    assert use_compile_cache_flag(args) is None
    assert jax.config.jax_compilation_cache_dir == jax_settings["jax_compilation_cache_dir"]
    monkeypatch.setenv("ZEROGNN_COMPILE_CACHE", " ")  # blank: unset
    assert build_parser().parse_args(["train"]).compile_cache is None
    monkeypatch.setenv("ZEROGNN_COMPILE_CACHE", str(tmp_path.resolve() / "env"))
    args = build_parser().parse_args(["export", "ckpt", "--out", "x"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert use_compile_cache_flag(args) == tmp_path.resolve() / "env"
    # a command that compiles little takes no flag
    assert "compile_cache" not in vars(build_parser().parse_args(["data", "info", "tiny"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--compile-cache", " "])


def test_jax_s_warnings_on_the_folder_print_as_one_line_of_the_command():
    from zerognn_jax.cli import _format_warning

    message = UserWarning("Error reading persistent compilation cache entry for 'jit_run': "
                          "error: Error -5 while decompressing data\nmore")
    line = _format_warning(message, UserWarning, "compiler.py", 1)
    assert line == ("zerognn: warning: Error reading persistent compilation cache entry for "
                    "'jit_run': error: Error -5 while decompressing data (--compile-cache)\n")
