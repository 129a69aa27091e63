"""Settings of the ``lite-push`` command: flags, environment, TOML file.

Every :class:`~lite_push.ConsumerConfig` field whose type is a plain value
(int, float, str, bool, an enum, or an optional one of those) is a setting,
and so are the service settings that are not consumer fields (the source
URL and how its group is balanced, the listener, the topic, its tag filter,
where a new group starts, and how many member processes run).
Each can come from four places; the first that has it wins:

1. a command-line flag (``--lanes 64``);
2. an environment variable ``LITE_PUSH_<NAME>`` (``LITE_PUSH_LANES=64``);
3. the TOML file of ``--config``: consumer fields in its ``[consumer]``
   table, the service settings in ``[source]`` (``url``, ``balance``; and
   the ``[source.kafka]`` table, below), ``[listener]`` (``path``),
   ``[subscription]`` (``topic``, ``tags``, ``from``) and ``[service]``
   (``processes``);
4. the default (the dataclass default; none for the service settings).

Values are converted to the field's type from the dataclass annotations:
ints and floats from their text, bools from ``1/true/yes/on`` and
``0/false/no/off``, enums by name (``KEY_ORDERLY``, any case), and
``none`` (or an empty string) for an optional field means ``None``.  Range
checks are left to :class:`~lite_push.ConsumerConfig`, which raises
:class:`~lite_push.ConfigError` naming the field.  The service settings are
text, except the counts of :data:`SERVICE_COUNTS` (``processes``), which are
ints checked here against their least value, and the choices of
:data:`SERVICE_ENUMS` (``balance``), which are enum names (any case)
checked here.

A TOML key, table or ``LITE_PUSH_*`` environment variable that names no
setting is an error naming it (``LITE_PUSH_*`` variables read elsewhere are
allowed: :data:`NON_CONFIG_ENV`).

The ``[source.kafka]`` table is the exception: its keys are settings of a
``kafka://`` source (librdkafka properties, and the KafkaBroker arguments a
``kafka://`` URL's query may carry), which
:func:`~lite_push.cli.sources.open_source` merges under the URL's query and
librdkafka checks by name.  Here its values must only be strings, numbers or
booleans (:attr:`Settings.kafka`).  It comes from the file only.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._config import ConsumerConfig
from .._errors import ConfigError
from ..sources.contract import Balance
from .errors import CliError

__all__ = [
    "KafkaValue",
    "require",
    "settings_of",
    "ENV_PREFIX",
    "NON_CONFIG_ENV",
    "SERVICE_COUNTS",
    "SERVICE_ENUMS",
    "SERVICE_SETTINGS",
    "Settings",
    "consumer_fields",
    "env_name",
    "load_settings",
]

#: Prefix of the environment variables that hold settings.
ENV_PREFIX = "LITE_PUSH_"

#: ``LITE_PUSH_*`` environment variables that are not settings of the
#: command (read by the package, its tests or its benchmarks).
NON_CONFIG_ENV: frozenset[str] = frozenset(
    {
        "LITE_PUSH_NO_EXTENSIONS",
        "LITE_PUSH_REQUIRE_EXTENSIONS",
        "LITE_PUSH_OFFSET_DIR",
        "LITE_PUSH_JAVA_SEED",
    }
)

#: Settings that are not ConsumerConfig fields: name -> (TOML table, key).
#: Their environment variables are ``LITE_PUSH_<NAME>``.
SERVICE_SETTINGS: Mapping[str, tuple[str, str]] = types.MappingProxyType(
    {
        "source": ("source", "url"),
        "balance": ("source", "balance"),
        "listener": ("listener", "path"),
        "topic": ("subscription", "topic"),
        "tags": ("subscription", "tags"),
        "from": ("subscription", "from"),
        "processes": ("service", "processes"),
    }
)

#: Service settings that are counts, not text: name -> least value.  They
#: are converted to an int and checked here (``processes``: member processes
#: of ``lite-push consume``, 1 by default).
SERVICE_COUNTS: Mapping[str, int] = types.MappingProxyType({"processes": 1})

#: Service settings that are one of an enum's members, named in any case:
#: name -> the enum.  Checked here and kept as the member's name
#: (``balance``: how the source spreads the group's messages over its
#: members, ``queue`` by default; see :attr:`Settings.balance`).
SERVICE_ENUMS: Mapping[str, type[enum.Enum]] = types.MappingProxyType({"balance": Balance})

#: A value of the ``[source.kafka]`` table.
KafkaValue = str | int | float | bool

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NONE = frozenset({"", "none", "null"})


@dataclass(frozen=True, slots=True)
class _FieldType:
    """A settable field's base type and whether it may be ``None``."""

    base: type
    optional: bool
    #: A number that may also be a word (``steal_after="auto"``): text that
    #: is not a number is passed on, for ConsumerConfig to check.
    word: bool = False


def _settable(tp: object) -> _FieldType | None:
    """The :class:`_FieldType` of annotation ``tp``, or ``None`` when a
    value of that type cannot be written as text (a callable, ...)."""
    optional = False
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if set(args) == {float, str}:  # a number or a word
            return _FieldType(float, type(None) in typing.get_args(tp), word=True)
        enums = [a for a in args if isinstance(a, type) and issubclass(a, enum.Enum)]
        if len(enums) == 1 and set(args) == {enums[0], str}:  # a member or its name: the member
            return _FieldType(enums[0], type(None) in typing.get_args(tp))
        if len(args) != 1 or len(typing.get_args(tp)) != 2:
            return None
        optional = True
        tp = args[0]
    if not isinstance(tp, type):
        return None
    if tp in (int, float, str, bool) or issubclass(tp, enum.Enum):
        return _FieldType(tp, optional)
    return None


def consumer_fields() -> dict[str, _FieldType | None]:
    """ConsumerConfig's fields, in declaration order, with their settable
    type (``None`` for a field that cannot be set from text, such as
    ``key_extractor``)."""
    hints = typing.get_type_hints(ConsumerConfig)
    return {f.name: _settable(hints[f.name]) for f in dataclasses.fields(ConsumerConfig)}


def env_name(name: str) -> str:
    """The environment variable of setting ``name``: ``LITE_PUSH_LANES``."""
    return ENV_PREFIX + name.upper()


def _at(name: str, origin: str) -> str:
    """Where a bad value came from, before the message: the environment
    variable or the file's key; nothing for the setting's own flag (the
    error already names the setting)."""
    return "" if origin == "--" + name.replace("_", "-") else f"{origin}: "


def _convert(name: str, ft: _FieldType, value: object, origin: str) -> object:
    """``value`` (text from the environment, a TOML value or an already
    typed flag) as field ``name``'s type; ``ConfigError`` naming ``name``
    when it is not one."""
    base = ft.base
    if ft.optional and (value is None or (isinstance(value, str) and value.strip().lower() in _NONE)):
        return None
    if value is None:
        raise ConfigError(name, f"{_at(name, origin)}must be a {base.__name__}, got nothing")
    text = value.strip() if isinstance(value, str) else None
    if base is bool:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(name, f"{_at(name, origin)}must be a bool (true/false), got {value!r}")
    if issubclass(base, enum.Enum):
        if isinstance(value, base):
            return value
        names = [m.name for m in base]
        if text is not None:
            for m in base:
                if m.name.upper() == text.upper():
                    return m
        raise ConfigError(name, f"{_at(name, origin)}must be one of {', '.join(names)}, got {value!r}")
    if base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text is not None:
            try:
                return int(text, 10)
            except ValueError:
                pass
        raise ConfigError(name, f"{_at(name, origin)}must be an int, got {value!r}")
    if base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if text is not None:
            try:
                return float(text)
            except ValueError:
                if ft.word:
                    return text  # ConsumerConfig says which words it takes
        raise ConfigError(name, f"{_at(name, origin)}must be a number, got {value!r}")
    if isinstance(value, str):  # base is str
        return value
    raise ConfigError(name, f"{_at(name, origin)}must be a string, got {value!r}")


_TEXT = _FieldType(str, False)
_INT = _FieldType(int, False)


def _count(name: str, raw: object, origin: str) -> int:
    """Service count ``name`` (:data:`SERVICE_COUNTS`) as an int at least
    its least value; ``ConfigError`` naming ``name`` otherwise."""
    value = _convert(name, _INT, raw, origin)
    assert isinstance(value, int)
    least = SERVICE_COUNTS[name]
    if value < least:
        raise ConfigError(name, f"{_at(name, origin)}must be an int >= {least}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Settings:
    """The merged settings of one command.

    ``consumer`` holds the ConsumerConfig fields that were set somewhere
    (the others keep their dataclass defaults); ``service`` the service
    settings that were set (``source``, ``listener``, ``topic``, ``tags``,
    ``from``, ``processes`` as checked decimal text: see :attr:`processes`,
    and ``balance`` as a checked member name: see :attr:`balance`);
    ``origins`` says where each came from (``"--lanes"``,
    ``"LITE_PUSH_LANES"``, ``"app.toml [consumer] lanes"``); ``kafka`` the
    config file's ``[source.kafka]`` table (empty without one).
    """

    consumer: Mapping[str, Any] = field(default_factory=dict)
    service: Mapping[str, str] = field(default_factory=dict)
    origins: Mapping[str, str] = field(default_factory=dict)
    kafka: Mapping[str, KafkaValue] = field(default_factory=dict)

    def get(self, name: str) -> str | None:
        """A service setting (``"source"``, ``"topic"``, ...), or ``None``."""
        return self.service.get(name)

    @property
    def processes(self) -> int:
        """How many member processes ``lite-push consume`` runs (1 unless set)."""
        return int(self.service.get("processes", "1"))

    @property
    def balance(self) -> Balance:
        """How the source spreads the group's messages over its members
        (``Balance.QUEUE`` unless set)."""
        return Balance[self.service.get("balance", Balance.QUEUE.name)]

    def consumer_config(self, **overrides: Any) -> ConsumerConfig:
        """The :class:`~lite_push.ConsumerConfig` of these settings, with
        ``overrides`` applied last.  Raises ``ConfigError`` naming the field
        for a missing group or a value out of range."""
        kwargs = {**self.consumer, **overrides}
        if "group" not in kwargs:
            raise ConfigError(
                "group",
                "is required: --group, LITE_PUSH_GROUP or group in the config file's [consumer] table",
            )
        return ConsumerConfig(**kwargs)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{path} is not valid TOML: {e}") from None


def _kafka_table(path: Path, body: object) -> dict[str, KafkaValue]:
    """The ``[source.kafka]`` table of ``path``, checked: a table of
    strings, numbers and booleans."""
    if not isinstance(body, dict):
        raise ConfigError("source.kafka", f"must be a table ([source.kafka]) in {path}, got {body!r}")
    for key, value in body.items():
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(
                f"source.kafka.{key}",
                f"{path} [source.kafka]: must be a string, number or boolean, got {value!r}",
            )
    return dict(body)


def _toml_layer(
    path: Path, fields: Mapping[str, _FieldType | None]
) -> tuple[dict[str, tuple[object, str]], dict[str, KafkaValue]]:
    """Setting name -> (raw value, origin) from the TOML file ``path``, and
    its ``[source.kafka]`` table."""
    doc = _read_toml(path)
    by_table: dict[tuple[str, str], str] = {v: k for k, v in SERVICE_SETTINGS.items()}
    tables = {"consumer"} | {t for t, _ in SERVICE_SETTINGS.values()}
    out: dict[str, tuple[object, str]] = {}
    kafka: dict[str, KafkaValue] = {}
    for table, body in doc.items():
        if table not in tables:
            raise ConfigError(
                table,
                f"unknown table or key in {path} (known tables: {', '.join(sorted(tables))})",
            )
        if not isinstance(body, dict):
            raise ConfigError(table, f"must be a table ([{table}]) in {path}, got {body!r}")
        for key, value in body.items():
            origin = f"{path} [{table}] {key}"
            if table == "consumer":
                if key not in fields:
                    raise ConfigError(
                        key,
                        f"unknown key in {path} [consumer]: ConsumerConfig has no such field",
                    )
                if fields[key] is None:
                    raise ConfigError(key, f"cannot be set from a config file ({path} [consumer])")
                out[key] = (value, origin)
            elif table == "source" and key == "kafka":
                kafka = _kafka_table(path, value)
            else:
                name = by_table.get((table, key))
                if name is None:
                    known = ", ".join(k for t, k in SERVICE_SETTINGS.values() if t == table)
                    if table == "source":
                        known += ", and the [source.kafka] table"
                    raise ConfigError(
                        f"{table}.{key}",
                        f"unknown key in {path} [{table}] (known: {known})",
                    )
                out[name] = (value, origin)
    return out, kafka


def _env_layer(environ: Mapping[str, str], fields: Mapping[str, _FieldType | None]) -> dict[str, tuple[object, str]]:
    """Setting name -> (raw value, origin) from ``LITE_PUSH_*`` variables."""
    names = {env_name(n): n for n in (*fields, *SERVICE_SETTINGS)}
    out: dict[str, tuple[object, str]] = {}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in NON_CONFIG_ENV:
            continue
        name = names.get(var)
        if name is None:
            raise ConfigError(
                var,
                "names no lite-push setting (settings: LITE_PUSH_<ConsumerConfig field>, "
                + ", ".join(env_name(n) for n in SERVICE_SETTINGS)
                + ")",
            )
        if name in fields and fields[name] is None:
            raise ConfigError(var, f"{name} cannot be set from the environment")
        out[name] = (environ[var], var)
    return out


def load_settings(
    flags: Mapping[str, object] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Merge the settings: ``flags`` > ``environ`` > ``config_file`` > defaults.

    ``flags`` maps setting names (``"lanes"``, ``"source"``, ``"from"``) to
    the values given on the command line; a name that is present counts as
    given even when its value is ``None`` (``--no-metrics`` gives
    ``metrics_port=None``).  ``environ`` defaults to ``os.environ``.
    Raises :class:`~lite_push.ConfigError` naming the key for an unknown
    TOML key or table, a ``LITE_PUSH_*`` variable that names no setting, or
    a value that does not convert to its field's type.
    """
    fields = consumer_fields()
    layers: list[dict[str, tuple[object, str]]] = []
    kafka: dict[str, KafkaValue] = {}
    if config_file is not None:
        file_layer, kafka = _toml_layer(Path(config_file), fields)
        layers.append(file_layer)
    layers.append(_env_layer(os.environ if environ is None else environ, fields))
    flag_layer: dict[str, tuple[object, str]] = {}
    for name, value in (flags or {}).items():
        if name not in fields and name not in SERVICE_SETTINGS:
            raise ConfigError(name, "is not a lite-push setting")
        flag_layer[name] = (value, "--" + name.replace("_", "-"))
    layers.append(flag_layer)

    merged: dict[str, tuple[object, str]] = {}
    for layer in layers:  # lowest precedence first: later layers win
        merged.update(layer)
    consumer: dict[str, Any] = {}
    service: dict[str, str] = {}
    origins: dict[str, str] = {}
    for name, (raw, origin) in merged.items():
        origins[name] = origin
        if name in SERVICE_COUNTS:
            service[name] = str(_count(name, raw, origin))
        elif name in SERVICE_ENUMS:
            member = _convert(name, _FieldType(SERVICE_ENUMS[name], False), raw, origin)
            assert isinstance(member, enum.Enum)
            service[name] = member.name
        elif name in SERVICE_SETTINGS:
            value = _convert(name, _TEXT, raw, origin)
            assert isinstance(value, str)
            service[name] = value
        else:
            ft = fields[name]
            if ft is None:
                raise ConfigError(name, f"{_at(name, origin)}cannot be set from the command line")
            consumer[name] = _convert(name, ft, raw, origin)
    return Settings(consumer=consumer, service=service, origins=origins, kafka=kafka)


# -- for the commands ----------------------------------------------------------


def settings_of(args: argparse.Namespace, names: Sequence[str]) -> Settings:
    """Load the settings of a command: the flags in ``names`` that were
    given (argparse dest == setting name), the environment, ``--config``."""
    flags: dict[str, object] = {}
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            flags[name] = value
    if getattr(args, "no_metrics", False):
        flags["metrics_port"] = None
    return load_settings(flags, config_file=args.config)


def require(settings: Settings, name: str, flag: str) -> str:
    """The setting ``name``, which the command cannot do without: a
    :class:`~lite_push.cli.errors.CliError` saying where to give it when it
    is missing or blank."""
    value = settings.get(name) if name in SERVICE_SETTINGS else settings.consumer.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        table, key = SERVICE_SETTINGS.get(name, ("consumer", name))
        raise CliError(f"{flag} is required (or {env_name(name)}, or {key} in the config file's [{table}] table)")
    return str(value)
