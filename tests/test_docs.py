"""The reference pages keep up with the code: every setting and every stat is documented."""

from __future__ import annotations

import re

from helpers import ROOT
from scrapy.settings import Settings

from scrapy_bloomdupe import settings
from scrapy_bloomdupe.addon import BloomDupeAddon

DOCS = ROOT / "docs"
PACKAGE = ROOT / "scrapy_bloomdupe"

#: A settings table row: | `NAME` | type | default | meaning |
SETTING_ROW = re.compile(r"^\| `(BLOOMDUPE_[A-Z_]+)` \|([^|]+)\|([^|]+)\|([^|]+)\|\s*$", re.M)
#: A stat name in the package's code, as a string literal ("bloomdupe/x" or f"bloomdupe/x/{y}").
STAT_LITERAL = re.compile(r"""f?["']((?:bloomdupe|scheduler)/[a-z_/]+(?:\{\w+\})?)["']""")


def documented_settings() -> dict[str, tuple[str, str, str]]:
    text = (DOCS / "settings.md").read_text()
    return {m[1]: (m[2].strip(), m[3].strip(), m[4].strip())
            for m in SETTING_ROW.finditer(text)}


def test_every_setting_is_documented_with_type_default_and_meaning() -> None:
    documented = documented_settings()
    assert set(documented) == set(settings.DEFAULTS), (
        "docs/settings.md and settings.DEFAULTS differ: "
        f"undocumented {sorted(set(settings.DEFAULTS) - set(documented))}, "
        f"documented but unknown {sorted(set(documented) - set(settings.DEFAULTS))}")
    for name, columns in documented.items():
        assert all(columns), f"{name}: a type, a default and a meaning in docs/settings.md"


def test_documented_defaults_are_the_code_defaults() -> None:
    for name, (_, default, _) in documented_settings().items():
        value = settings.DEFAULTS[name]
        shown = re.match(r"`([^`]*)`", default)
        assert shown, f"{name}: the default in backquotes in docs/settings.md"
        expected = repr(value) if isinstance(value, str) else str(value)
        assert shown[1].replace('"', "'") == expected.replace('"', "'"), (
            f"{name}: docs/settings.md says {shown[1]}, settings.DEFAULTS has {value!r}")


def code_stats() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for literal in STAT_LITERAL.findall(path.read_text()):
            names.add(re.sub(r"\{\w+\}", "<counter>", literal))
    return names


def test_every_stat_is_documented() -> None:
    stats_page = (DOCS / "stats.md").read_text()
    names = code_stats()
    assert "bloomdupe/checked" in names  # the pattern finds the package's stats
    missing = sorted(name for name in names if f"`{name}`" not in stats_page)
    assert not missing, f"stats set by the package but not in docs/stats.md: {missing}"


# -- the first steps a user reads -------------------------------------------------------

ADDON_LINE = 'ADDONS = {"scrapy_bloomdupe.addon.BloomDupeAddon": 100}'


def addon_settings() -> dict[str, object]:
    """What the add-on sets, beside Scrapy's defaults."""
    given = Settings()
    BloomDupeAddon().update_settings(given)
    return {"SCHEDULER": given["SCHEDULER"], "DUPEFILTER_CLASS": given["DUPEFILTER_CLASS"],
            **{name: {k: v for k, v in given[name].items() if k.startswith("scrapy_bloomdupe")}
               for name in ("SPIDER_MIDDLEWARES", "DOWNLOADER_MIDDLEWARES", "EXTENSIONS")}}


def test_the_readme_s_quick_start_is_a_user_s_path_beside_the_checkout_s() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):]
    quick = quick[:quick.index("\n## ")]
    for step in ("pip install", "scrapy startproject", ADDON_LINE, "REDIS_URL = ",
                 "SCHEDULER_PERSIST = ", "scrapy crawl",
                 # the checkout's two commands (CI runs the second)
                 "bash scripts/bootstrap && .venv/bin/python example_project/run_demo.py",
                 "bash scripts/bootstrap && .venv/bin/python -m pytest -n auto"):
        assert step in quick, f"README's quick start lacks {step!r}"
    # The template's own `ADDONS = {}` comes after any line added above it.
    assert "template's own `ADDONS = {}` line" in quick and "silently overwritten" in quick


def test_the_readme_s_settings_by_hand_are_what_the_add_on_sets() -> None:
    """Set by hand, SCHEDULER and DUPEFILTER_CLASS alone miss the batch middleware
    (a WARNING at start): the README's block lists everything the add-on sets."""
    readme = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                if b.startswith("SCHEDULER = ")]
    values: dict[str, object] = {}
    exec(block, values)
    assert {k: v for k, v in values.items() if k.isupper()} == addon_settings()


def test_migrating_step_3_activates_the_add_on() -> None:
    text = (DOCS / "migrating.md").read_text()
    step = text[text.index("\n3. "):text.index("Tested with a real scrapy-redis crawl")]
    assert ADDON_LINE in step
    assert 'BLOOMDUPE_FINGERPRINT = "scrapy-redis"' in step
    # A project's own scrapy-redis SCHEDULER would win over the add-on's ("addon" priority).
    assert "delete scrapy-redis's `SCHEDULER` and `DUPEFILTER_CLASS` lines" in step
