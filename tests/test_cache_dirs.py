"""The cache folders: under `$XDG_CACHE_HOME` as the XDG rules place them, and
Planetoid's downloads where earlier versions left them."""

from pathlib import Path

import pytest

from zerognn_jax._src.data.cache_dirs import cache_dir
from zerognn_jax._src.data.planetoid import default_root


@pytest.mark.parametrize("xdg", [None, "", "relative/cache"])
def test_the_home_cache_serves_where_xdg_cache_home_does_not(xdg, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert cache_dir("xla") == tmp_path / ".cache" / "zerognn-jax" / "xla"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("xla") == tmp_path / "xdg" / "zerognn-jax" / "xla"


def test_planetoid_files_are_found_where_earlier_versions_downloaded_them(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    new = tmp_path / "xdg" / "zerognn-jax" / "planetoid"
    assert default_root() == new
    before = Path(tmp_path / ".cache" / "zerognn" / "planetoid")
    before.mkdir(parents=True)
    assert default_root() == before
    new.mkdir(parents=True)
    assert default_root() == new
