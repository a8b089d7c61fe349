"""The demo's settings from the environment: parsing, defaults, and what each variable switches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from demo_site import env
from tests.demo.conftest import ROOT, VARIABLES, load_settings

BASE = Path("/srv/project")
LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
REDIS = "django_redis.cache.RedisCache"


class TestDatabaseUrl:
    @pytest.mark.parametrize(
        ("url", "name"),
        [
            ("sqlite:///demo.sqlite3", "/srv/project/demo.sqlite3"),
            ("sqlite:///var/db/demo.sqlite3", "/srv/project/var/db/demo.sqlite3"),
            ("sqlite:////tmp/demo.sqlite3", "/tmp/demo.sqlite3"),
            ("SQLITE:////tmp/my%20demo.sqlite3", "/tmp/my demo.sqlite3"),
        ],
    )
    def test_sqlite_files(self, url: str, name: str) -> None:
        entry = env.parse_database_url(url, base_dir=BASE)
        assert entry["ENGINE"] == "django.db.backends.sqlite3"
        assert entry["NAME"] == name
        assert entry["OPTIONS"]["transaction_mode"] == "IMMEDIATE"

    @pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
    def test_sqlite_in_memory(self, url: str) -> None:
        entry = env.parse_database_url(url, base_dir=BASE)
        assert entry == {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}

    def test_postgres_in_full(self) -> None:
        entry = env.parse_database_url(
            "postgres://demo:s%40cret%3A1@db.example.com:5433/bucketry?sslmode=require",
            base_dir=BASE,
        )
        assert entry == {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "bucketry",
            "USER": "demo",
            "PASSWORD": "s@cret:1",
            "HOST": "db.example.com",
            "PORT": "5433",
            "OPTIONS": {"sslmode": "require"},
        }

    @pytest.mark.parametrize(
        ("url", "host", "port", "user"),
        [
            ("postgresql://localhost/demo", "localhost", "", ""),
            ("postgres://u@127.0.0.1/demo", "127.0.0.1", "", "u"),
            ("pgsql://u:p@[::1]:5432/demo", "::1", "5432", "u"),
            ("postgres://%2Frun%2Fpostgresql/demo", "/run/postgresql", "", ""),
            ("postgres:///demo", "", "", ""),
        ],
    )
    def test_postgres_variants(self, url: str, host: str, port: str, user: str) -> None:
        entry = env.parse_database_url(url, base_dir=BASE)
        assert (entry["NAME"], entry["HOST"], entry["PORT"], entry["USER"]) == (
            "demo",
            host,
            port,
            user,
        )
        assert "OPTIONS" not in entry

    @pytest.mark.parametrize(
        ("url", "says"),
        [
            ("mysql://u:p@host/db", "unsupported scheme 'mysql'"),
            ("demo.sqlite3", "unsupported scheme ''"),
            ("postgres://u:hunter2@host:5432", "names no database"),
            ("postgres://u:hunter2@host:5432/", "names no database"),
            ("postgres://u:hunter2@host:port/db", "is not a number"),
            ("postgres://u:hunter2@host:99999/db", "is not a number"),
            ("sqlite://host/db.sqlite3", "SQLite URLs have none"),
        ],
    )
    def test_mistakes_name_the_variable_and_hide_the_password(self, url: str, says: str) -> None:
        with pytest.raises(ImproperlyConfigured) as raised:
            env.parse_database_url(url, base_dir=BASE)
        message = str(raised.value)
        assert message.startswith("DATABASE_URL: ")
        assert says in message
        assert "hunter2" not in message
        assert "for example DATABASE_URL=" in message


class TestMemcachedServers:
    @pytest.mark.parametrize(
        ("value", "servers"),
        [
            ("", []),
            (" , ", []),
            ("127.0.0.1:11211", ["127.0.0.1:11211"]),
            ("10.0.0.1:11211, 10.0.0.2:11212,", ["10.0.0.1:11211", "10.0.0.2:11212"]),
            ("cache.internal", ["cache.internal:11211"]),
            ("[::1]:11211", ["[::1]:11211"]),
            ("unix:/run/memcached.sock", ["unix:/run/memcached.sock"]),
        ],
    )
    def test_servers(self, value: str, servers: list[str]) -> None:
        assert env.parse_memcached_servers(value) == servers

    @pytest.mark.parametrize(
        "value", ["host:port", "host:0", "host:70000", ":11211", "a b:1", "unix:", "h/x:1"]
    )
    def test_mistakes(self, value: str) -> None:
        with pytest.raises(ImproperlyConfigured, match=r"^MEMCACHED_SERVERS: "):
            env.parse_memcached_servers(value)


class TestRedisUrl:
    @pytest.mark.parametrize(
        "value",
        [
            "redis://127.0.0.1:6379/0",
            "redis://:pw@redis.internal/2",
            "rediss://redis.example.com:6380",
            "unix:///run/redis.sock",
        ],
    )
    def test_valid(self, value: str) -> None:
        assert env.parse_redis_url(f" {value} ") == value

    @pytest.mark.parametrize(
        "value", ["127.0.0.1:6379", "http://x", "redis://", "redis://h:port/0", "redis://h/db"]
    )
    def test_mistakes(self, value: str) -> None:
        with pytest.raises(ImproperlyConfigured, match=r"^REDIS_URL: "):
            env.parse_redis_url(value)

    def test_the_password_is_masked(self) -> None:
        with pytest.raises(ImproperlyConfigured) as raised:
            env.parse_redis_url("redis://:hunter2@h:port/0")
        assert "hunter2" not in str(raised.value)
        assert env.masked_url("redis://u:hunter2@h:1/0") == "redis://u:***@h:1/0"


class TestSmallValues:
    @pytest.mark.parametrize(("raw", "value"), [("1", True), ("TRUE", True), ("off", False)])
    def test_booleans(self, raw: str, value: bool) -> None:
        assert env.get_bool({"DEBUG": raw}, "DEBUG", not value) is value

    def test_a_blank_boolean_is_the_default(self) -> None:
        assert env.get_bool({"DEBUG": " "}, "DEBUG", True) is True

    def test_a_bad_boolean_names_the_variable(self) -> None:
        with pytest.raises(ImproperlyConfigured, match=r"^DEBUG: 'maybe' is not a boolean"):
            env.get_bool({"DEBUG": "maybe"}, "DEBUG", True)

    def test_lists(self) -> None:
        assert env.get_list({}, "ALLOWED_HOSTS", ["a"]) == ["a"]
        assert env.get_list({"ALLOWED_HOSTS": " x.org, ,y.org "}, "ALLOWED_HOSTS", []) == [
            "x.org",
            "y.org",
        ]

    def test_the_secret_key_is_generated_once(self, tmp_path: Path) -> None:
        path = tmp_path / "state" / "secret_key"
        first = env.secret_key({}, path)
        assert len(first) >= 50
        assert env.secret_key({}, path) == first
        assert path.stat().st_mode & 0o777 == 0o600
        assert list(path.parent.iterdir()) == [path]  # no temporary file left
        assert env.secret_key({"SECRET_KEY": "given"}, path) == "given"


class TestSettingsModule:
    def test_embedded_defaults_need_no_server(self, tmp_path: Path) -> None:
        names = load_settings(tmp_path)
        assert names["DEBUG"] is True
        assert names["ALLOWED_HOSTS"] == ["127.0.0.1", "localhost", "[::1]"]
        assert names["DATABASES"]["default"]["NAME"] == str(tmp_path / "db.sqlite3")
        assert {alias: c["BACKEND"] for alias, c in names["CACHES"].items()} == {
            "default": LOCMEM,
            "ratelimit": LOCMEM,
        }
        assert names["CELERY_BROKER_URL"] == "filesystem://localhost//"
        options = names["CELERY_BROKER_TRANSPORT_OPTIONS"]
        assert options["data_folder_in"] == options["data_folder_out"]
        assert Path(options["data_folder_in"]).is_dir()
        assert Path(options["data_folder_in"]).parent == tmp_path / "broker"
        assert names["CELERY_BEAT_SCHEDULE_FILENAME"] == str(tmp_path / "celerybeat-schedule")
        assert names["SILENCED_SYSTEM_CHECKS"] == ["ratelimit_app.W001", "metrics_app.W001"]
        # The generated key is kept: a second start (or the worker) reads the same one.
        assert (tmp_path / "secret_key").read_text().strip() == names["SECRET_KEY"]
        assert load_settings(tmp_path)["SECRET_KEY"] == names["SECRET_KEY"]

    def test_memcached_servers_take_the_counters(self, tmp_path: Path) -> None:
        names = load_settings(tmp_path, {"MEMCACHED_SERVERS": "127.0.0.1:11211,127.0.0.1:11212"})
        ratelimit = names["CACHES"]["ratelimit"]
        assert ratelimit["BACKEND"] == MEMCACHED
        assert ratelimit["LOCATION"] == ["127.0.0.1:11211", "127.0.0.1:11212"]
        assert names["CACHES"]["default"]["BACKEND"] == MEMCACHED  # the lock is shared too
        assert names["CELERY_BROKER_URL"] == "filesystem://localhost//"
        assert names["SILENCED_SYSTEM_CHECKS"] == []

    def test_redis_takes_the_caches_and_the_broker(self, tmp_path: Path) -> None:
        url = "redis://127.0.0.1:6379/3"
        names = load_settings(tmp_path, {"REDIS_URL": url})
        for alias in ("default", "ratelimit"):
            assert names["CACHES"][alias]["BACKEND"] == REDIS
            assert names["CACHES"][alias]["LOCATION"] == url
        assert names["CELERY_BROKER_URL"] == url
        assert names["CELERY_BROKER_TRANSPORT_OPTIONS"] == {}
        assert not (tmp_path / "broker").exists()

    def test_memcached_and_redis_together(self, tmp_path: Path) -> None:
        names = load_settings(
            tmp_path, {"MEMCACHED_SERVERS": "127.0.0.1:11211", "REDIS_URL": "redis://h/0"}
        )
        assert names["CACHES"]["ratelimit"]["BACKEND"] == MEMCACHED
        assert names["CACHES"]["default"]["BACKEND"] == REDIS
        assert names["CELERY_BROKER_URL"] == "redis://h/0"

    def test_database_url_and_the_rest(self, tmp_path: Path) -> None:
        names = load_settings(
            tmp_path,
            {
                "DATABASE_URL": "postgres://demo:pw@127.0.0.1:5432/demo",
                "DEBUG": "false",
                "ALLOWED_HOSTS": "demo.example.com",
                "SECRET_KEY": "from-the-environment",
            },
        )
        assert names["DATABASES"]["default"]["ENGINE"] == "django.db.backends.postgresql"
        assert names["DEBUG"] is False
        assert names["ALLOWED_HOSTS"] == ["demo.example.com"]
        assert names["SECRET_KEY"] == "from-the-environment"
        assert not (tmp_path / "secret_key").exists()

    def test_a_bad_variable_stops_the_settings(self, tmp_path: Path) -> None:
        with pytest.raises(ImproperlyConfigured, match=r"^REDIS_URL: "):
            load_settings(tmp_path, {"REDIS_URL": "localhost:6379"})


@pytest.mark.parametrize(
    ("environ", "broker"),
    [
        ({}, "filesystem://localhost//"),
        ({"REDIS_URL": "redis://127.0.0.1:1/5"}, "redis://127.0.0.1:1/5"),
    ],
)
def test_the_celery_app_takes_the_broker_and_the_beat_schedule(
    tmp_path: Path, environ: dict[str, str], broker: str
) -> None:
    """``demo_site.celery`` as ``celery -A demo_site`` loads it, in a process of its own."""
    script = (
        "import json\n"
        "from demo_site.celery import app\n"
        "print(json.dumps({'broker': app.conf.broker_url, "
        "'beat': sorted(app.conf.beat_schedule), "
        "'tasks': sorted(t for t in app.tasks if t.startswith('metrics_app.'))}))\n"
    )
    child_env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    child_env.update(
        environ, DEMO_STATE_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="demo_site.settings"
    )
    done = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup()\n{script}"],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["broker"] == broker
    assert found["beat"] == ["metrics-downsample"]
    assert found["tasks"] == [
        "metrics_app.downsample",
        "metrics_app.downsample_series",
        "metrics_app.flush_redis_buffer",
    ]
