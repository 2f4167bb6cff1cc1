"""The add-on: what it sets in the settings."""

from __future__ import annotations

import pytest
from helpers import DemoSpider
from scrapy.utils.test import get_crawler

from scrapy_bloomdupe.addon import BloomDupeAddon
from scrapy_bloomdupe.exceptions import ConfigError


def test_addon_sets_components() -> None:
    crawler = get_crawler(DemoSpider, {"ADDONS": {BloomDupeAddon: 100}})
    settings = crawler.settings
    assert settings["DUPEFILTER_CLASS"].endswith("RedisBloomDupeFilter")
    assert settings["SCHEDULER"] == "scrapy_bloomdupe.scheduler.Scheduler"
    assert "scrapy_bloomdupe.extension.BloomDupeStats" in settings.getdict("EXTENSIONS")


def test_addon_can_keep_scrapys_scheduler() -> None:
    crawler = get_crawler(DemoSpider, {"ADDONS": {BloomDupeAddon: 100},
                                       "BLOOMDUPE_SCHEDULER": False})
    assert crawler.settings["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"


def test_addon_refuses_an_unknown_scheduler_value() -> None:
    with pytest.raises(ConfigError) as info:
        get_crawler(DemoSpider, {"ADDONS": {BloomDupeAddon: 100},
                                 "BLOOMDUPE_SCHEDULER": "maybe"})
    assert info.value.setting == "BLOOMDUPE_SCHEDULER"
