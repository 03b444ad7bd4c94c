# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside
# gpufleet.upgrade.
"""The ``GPUUpgradeQualification`` record (seed 004 schema) and the read-only upgrade gate.

Two stages, each collecting every problem it finds:

* loading (``parse_record``): size, UTF-8, one YAML document, no anchors/aliases/custom tags,
  no duplicate keys, no unknown fields, every field present with its exact type. When loading
  fails nothing else is checked.
* rules (``record_problems`` for the record alone, ``check_gate`` for record plus live tuple):
  the seven gate rules of issue 2, in order.

The YAML loader is built on PyYAML's SafeLoader but refuses anchors, aliases and tags while
composing (before anything is constructed, so an alias bomb never expands), resolves only
``true``/``false`` as booleans, never resolves timestamps (``completedAt`` is parsed here as
RFC 3339, quoted or not), and has no merge key.
"""
from __future__ import annotations

import dataclasses
import datetime
import re
import traceback
import typing as t

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _duration, _pci, _rke2
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show

YAML_IMPORT_ERROR = None  # type: t.Optional[str]
try:
    import yaml
    from yaml.events import AliasEvent, CollectionStartEvent, MappingStartEvent, ScalarEvent, StreamEndEvent
    from yaml.nodes import ScalarNode
except ImportError:  # pragma: no cover - reported by the modules with missing_required_lib
    yaml = None
    YAML_IMPORT_ERROR = traceback.format_exc()

API_VERSION = 'kube-dc.io/v1alpha1'
KIND = 'GPUUpgradeQualification'
PATH_MAX = 4096   # a path in a message is shown whole (the operator's own input; Linux PATH_MAX)
MAX_RECORD_BYTES = 65536
MAX_DEPTH = 8
FUTURE_SKEW = datetime.timedelta(minutes=5)
DEFAULT_MAX_CANARY_AGE = '720h'
PASS_PREFIX = 'GPU upgrade gate: PASS'
PASS_REMINDER = 'A PASS permits only the reviewed serialized canary/upgrade plan.'
BLOCK_PREFIX = 'GPU upgrade blocked: '

# (module-side snake_case name, record-side name), in the order of every message.
COMPONENTS = (
    ('kernel', 'kernel'),
    ('rke2', 'rke2'),
    ('driver', 'driver'),
    ('gpu_operator', 'gpuOperator'),
    ('dcgm_exporter', 'dcgmExporter'),
)
RECORD_COMPONENTS = tuple(r for _s, r in COMPONENTS)
MODULE_COMPONENTS = tuple(s for s, _r in COMPONENTS)
CANARY_RESULTS = ('allocationPassed', 'monitoringPassed', 'rollbackPassed')

TOP_FIELDS = ('apiVersion', 'kind', 'id', 'state', 'approvedBy', 'sourceRevision', 'hardware', 'target', 'canary')
CANARY_FIELDS = ('completedAt',) + CANARY_RESULTS + ('evidence',)

_ID_RE = re.compile(r'[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?')
_REVISION_RE = re.compile(r'[0-9a-fA-F]{40}')
_RFC3339_RE = re.compile(
    r'([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?'
    r'(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))')

_STR = 'tag:yaml.org,2002:str'
_ALLOWED_TAGS = {'scalar': (_STR,), 'sequence': ('tag:yaml.org,2002:seq',), 'mapping': ('tag:yaml.org,2002:map',)}


class QualificationError(Exception):
    """A record (or gate input) with problems; ``problems`` is the full list of messages."""

    def __init__(self, problems: t.List[str]) -> None:
        self.problems = list(problems)
        super().__init__('; '.join(self.problems))


@dataclasses.dataclass(frozen=True)
class Record:
    """A loaded record: every field present and of its type (values not yet judged)."""

    id: str
    state: str
    approved_by: str
    source_revision: str
    hardware: t.Tuple[str, ...]
    target: t.Dict[str, str]          # record names: kernel, rke2, driver, gpuOperator, dcgmExporter
    completed_at: datetime.datetime   # timezone-aware
    allocation_passed: bool
    monitoring_passed: bool
    rollback_passed: bool
    evidence: str
    api_version: str = API_VERSION
    kind: str = KIND

    def to_dict(self) -> t.Dict[str, t.Any]:
        """The normalised record in the seed schema (revision and PCI ids lowercased and trimmed
        where valid, ``completedAt`` in UTC)."""
        hardware = []
        for item in self.hardware:
            hardware.append(_pci.normalize(item) if _pci.is_valid(item) else item)
        revision = self.source_revision.lower() if _REVISION_RE.fullmatch(self.source_revision) else self.source_revision
        return {
            'apiVersion': self.api_version,
            'kind': self.kind,
            'id': self.id,
            'state': self.state,
            'approvedBy': self.approved_by,
            'sourceRevision': revision,
            'hardware': hardware,
            'target': {name: self.target[name] for name in RECORD_COMPONENTS},
            'canary': {
                'completedAt': format_timestamp(self.completed_at),
                'allocationPassed': self.allocation_passed,
                'monitoringPassed': self.monitoring_passed,
                'rollbackPassed': self.rollback_passed,
                'evidence': self.evidence,
            },
        }

    def summary(self) -> t.Dict[str, str]:
        """What a PASS reports: id, approver, revision (lowercased), completion time (UTC)."""
        return {
            'id': self.id,
            'approved_by': self.approved_by,
            'source_revision': self.source_revision.lower(),
            'completed_at': format_timestamp(self.completed_at),
        }


@dataclasses.dataclass
class GateResult:
    passed: bool
    problems: t.List[str]
    qualification: t.Optional[t.Dict[str, str]] = None
    record: t.Optional[Record] = None

    @property
    def msg(self) -> str:
        if self.passed and self.qualification:
            q = self.qualification
            return ('%s: qualification %s approved by %s, source revision %s, canary completed %s. %s'
                    % (PASS_PREFIX, show(q['id']), show(q['approved_by']), q['source_revision'],
                       q['completed_at'], PASS_REMINDER))
        return BLOCK_PREFIX + '; '.join(self.problems)


# --- timestamps ---------------------------------------------------------------------------

def parse_timestamp(value: str) -> datetime.datetime:
    """RFC 3339 date-time with a mandatory offset (``Z`` or ``±HH:MM``); raise ValueError.

    Fractions beyond microseconds are truncated; ``-00:00`` means UTC; leap seconds are refused.
    """
    m = _RFC3339_RE.fullmatch(value)
    if not m:
        raise ValueError(value)
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    micro = int((m.group(7) or '0')[:6].ljust(6, '0'))
    if m.group(8):
        tz = datetime.timezone.utc
    else:
        oh, om = int(m.group(10)), int(m.group(11))
        if oh > 23 or om > 59:
            raise ValueError(value)
        offset = datetime.timedelta(hours=oh, minutes=om)
        tz = datetime.timezone(-offset if m.group(9) == '-' else offset)
    try:
        return datetime.datetime(year, month, day, hour, minute, second, micro, tzinfo=tz).astimezone(datetime.timezone.utc)
    except OverflowError:  # an offset that moves the instant outside years 1..9999
        raise ValueError(value)


def format_timestamp(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with ``Z``; microseconds only when present."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    utc = value.astimezone(datetime.timezone.utc)
    # Explicit zero padding: strftime's %Y writes year 999 as "999" on glibc, which no RFC 3339
    # reader (parse_timestamp included) accepts.
    text = '%04d-%02d-%02dT%02d:%02d:%02d' % (utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second)
    if utc.microsecond:
        text += ('.%06d' % utc.microsecond).rstrip('0')
    return text + 'Z'


# --- the strict YAML loader -----------------------------------------------------------------

class _LoadProblem(Exception):
    pass


class _LongNumber:
    """What the loader makes of an integer of more than MAX_INT_BITS bits, or of a float too large
    for a float (a sexagesimal ``1:0:...:0.5`` of 175+ parts, more than 300 digits): never a field's
    value, and one that CPython cannot even convert to text (``int``/``repr`` refuse more than 4300
    decimal digits), so it stands in for it and the field is reported, with no traceback."""

    def __repr__(self) -> str:
        return '<a number of more than 300 digits>'


MAX_INT_BITS = 1000  # 2 ** 1000 has 302 decimal digits


_LOADER_CLASS = None  # type: t.Any


def _loader_class() -> t.Any:
    """SafeLoader made strict (built lazily: module_utils must import without PyYAML)."""
    global _LOADER_CLASS
    if _LOADER_CLASS is not None:
        return _LOADER_CLASS
    if yaml is None:
        raise _LoadProblem('the PyYAML Python library is required to read qualification records')

    class StrictLoader(yaml.SafeLoader):
        """One document; no anchors, aliases, tags other than !!str/!!seq/!!map on their own kind;
        no duplicate keys; at most MAX_DEPTH levels of nesting."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._path: t.List[str] = []
            self.duplicates: t.List[t.Tuple[int, str]] = []

        def _where(self) -> str:
            return ''.join(self._path).lstrip('.') or 'the record'

        def get_single_node(self) -> t.Any:
            self.get_event()  # StreamStart
            document = None
            if not self.check_event(StreamEndEvent):
                document = self.compose_document()
            if not self.check_event(StreamEndEvent):
                raise _LoadProblem('multiple YAML documents are not allowed')
            self.get_event()
            return document

        def compose_node(self, parent: t.Any, index: t.Any) -> t.Any:
            event = self.peek_event()
            if isinstance(index, ScalarNode):
                self._path.append(_path_part(index.value))
            elif isinstance(index, int):
                self._path.append('[%d]' % index)
            elif parent is not None:
                self._path.append('.(key)')
            else:
                self._path.append('')
            try:
                line = event.start_mark.line + 1
                if isinstance(event, AliasEvent):
                    raise _LoadProblem('YAML aliases are not allowed: %s at %s (line %d)'
                                       % (show('*' + event.anchor), self._where(), line))
                if event.anchor is not None:
                    raise _LoadProblem('YAML anchors are not allowed: %s at %s (line %d)'
                                       % (show('&' + event.anchor), self._where(), line))
                kind = 'scalar' if isinstance(event, ScalarEvent) else (
                    'mapping' if isinstance(event, MappingStartEvent) else 'sequence')
                if event.tag is not None and event.tag not in _ALLOWED_TAGS[kind]:
                    raise _LoadProblem('YAML tag %s is not allowed at %s (line %d)'
                                       % (show(event.tag), self._where(), line))
                if isinstance(event, CollectionStartEvent) and len(self._path) > MAX_DEPTH:
                    raise _LoadProblem('the record nests deeper than %d levels at %s (line %d)'
                                       % (MAX_DEPTH, self._where(), line))
                node = super().compose_node(parent, index)
                node.gf_path = self._where()
                return node
            finally:
                self._path.pop()

        def construct_mapping(self, node: t.Any, deep: bool = False) -> t.Dict[str, t.Any]:
            mapping: t.Dict[str, t.Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode):
                    raise _LoadProblem('mapping keys must be plain strings at %s (line %d)'
                                       % (getattr(node, 'gf_path', 'the record'), key_node.start_mark.line + 1))
                key = key_node.value
                if key in mapping:
                    line = key_node.start_mark.line + 1
                    self.duplicates.append((line, 'duplicate field %s (line %d)' % (show(_join(node.gf_path, key)), line)))
                    continue
                mapping[key] = self.construct_object(value_node, deep=deep)
            return mapping

        def construct_yaml_int(self, node: t.Any) -> t.Any:
            try:
                value = super().construct_yaml_int(node)
            except ValueError:  # more decimal digits than CPython converts (sys.get_int_max_str_digits)
                return _LongNumber()
            if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:  # hex, octal, sexagesimal
                return _LongNumber()
            return value

        def construct_yaml_float(self, node: t.Any) -> t.Any:
            try:
                return super().construct_yaml_float(node)
            except OverflowError:  # a sexagesimal float of 175+ parts: PyYAML multiplies by 60 ** n as an int
                return _LongNumber()

    StrictLoader.add_constructor('tag:yaml.org,2002:int', StrictLoader.construct_yaml_int)
    StrictLoader.add_constructor('tag:yaml.org,2002:float', StrictLoader.construct_yaml_float)

    drop = {'tag:yaml.org,2002:bool', 'tag:yaml.org,2002:timestamp', 'tag:yaml.org,2002:merge',
            'tag:yaml.org,2002:value', 'tag:yaml.org,2002:yaml'}
    resolvers: t.Dict[t.Any, t.List[t.Any]] = {}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        kept = [(tag, rx) for tag, rx in entries if tag not in drop]
        if kept:
            resolvers[first] = kept
    StrictLoader.yaml_implicit_resolvers = resolvers
    StrictLoader.add_implicit_resolver(
        'tag:yaml.org,2002:bool', re.compile(r'^(?:true|True|TRUE|false|False|FALSE)$'), list('tTfF'))
    _LOADER_CLASS = StrictLoader
    return StrictLoader


_PLAIN_KEY_RE = re.compile(r'[A-Za-z0-9_<-]{1,64}')


def _path_part(key: str) -> str:
    """One step of a field path: ``.key``, or ``["odd key"]`` (quoted and bounded) for keys that
    are not plain words, so that nothing from a record reaches a message raw."""
    return '.' + key if _PLAIN_KEY_RE.fullmatch(key) else '[%s]' % show(key, 40)


def _join(path: str, key: str) -> str:
    part = _path_part(key)
    if path in ('', 'the record'):
        return part[1:] if part.startswith('.') else part
    return path + part


def _load_yaml(text: str) -> t.Any:
    loader = None
    try:
        loader = _loader_class()(text)
        data = loader.get_single_data()
    except _LoadProblem:
        raise
    except OverflowError:  # pragma: no cover - the int and float constructors turn every one we know into _LongNumber
        raise _LoadProblem('the record holds a number too large to read')
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = ' (line %d, column %d)' % (mark.line + 1, mark.column + 1) if mark else ''
        raise _LoadProblem('the record is not valid YAML: %s%s' % (exc.problem or exc.context, where))
    except yaml.reader.ReaderError as exc:
        raise _LoadProblem('the record is not valid YAML: unacceptable character #x%04x at position %d'
                           % (ord(exc.character) if isinstance(exc.character, str) else exc.character, exc.position))
    except yaml.YAMLError as exc:
        raise _LoadProblem('the record is not valid YAML: %s' % exc)
    finally:
        if loader is not None:
            loader.dispose()
    if loader.duplicates:
        raise QualificationError([message for _line, message in sorted(loader.duplicates)])
    return data


# --- loading --------------------------------------------------------------------------------

def _describe(value: t.Any) -> str:
    if value is None:
        return 'null'
    if isinstance(value, bool):
        return 'the boolean %s' % ('true' if value else 'false')
    if isinstance(value, _LongNumber):
        return 'a number of more than 300 digits'
    if isinstance(value, (int, float)):
        return 'the number %s' % show(value)
    if isinstance(value, str):
        return 'the string %s' % show(value)
    if isinstance(value, list):
        return 'a list'
    if isinstance(value, dict):
        return 'a mapping'
    return 'a %s' % type(value).__name__


def _field_problems(data: t.Dict[str, t.Any], allowed: t.Sequence[str], path: str) -> t.List[str]:
    problems = []
    for key in data:
        if key not in allowed:
            problems.append('unknown field %s' % show(_join(path, key)))
    for key in allowed:
        if key not in data:
            problems.append('missing field %s' % show(_join(path, key)))
    return problems


def _want_str(data: t.Dict[str, t.Any], key: str, path: str, problems: t.List[str]) -> None:
    if key in data and not isinstance(data[key], str):
        hint = ' (quote it)' if isinstance(data[key], (int, float, bool, _LongNumber)) or data[key] is None else ''
        problems.append('field %s must be a string, got %s%s' % (show(_join(path, key)), _describe(data[key]), hint))


def _want_mapping(data: t.Dict[str, t.Any], key: str, problems: t.List[str]) -> bool:
    if key not in data:
        return False
    if not isinstance(data[key], dict):
        problems.append('field %s must be a mapping, got %s' % (show(key), _describe(data[key])))
        return False
    return True


def parse_record(text: t.Union[str, bytes]) -> Record:
    """Load a record (the loading rules only) or raise QualificationError with every problem."""
    if isinstance(text, bytes):
        size = len(text)
    elif isinstance(text, str):
        size = len(text.encode('utf-8', 'surrogatepass'))
    else:
        raise QualificationError(['the record must be text, got %s' % type(text).__name__])
    if size > MAX_RECORD_BYTES:
        raise QualificationError(['the record is larger than %d bytes' % MAX_RECORD_BYTES])
    if isinstance(text, bytes):
        try:
            text = text.decode('utf-8')
        except UnicodeDecodeError as exc:
            raise QualificationError(['the record is not valid UTF-8 (byte %d)' % exc.start])
    try:
        data = _load_yaml(text)
    except _LoadProblem as exc:
        raise QualificationError([str(exc)])
    except RecursionError:  # pragma: no cover - MAX_DEPTH stops nesting long before this
        raise QualificationError(['the record nests too deeply'])
    if data is None:
        raise QualificationError(['the record is empty'])
    if not isinstance(data, dict):
        raise QualificationError(['the record must be a YAML mapping, got %s' % _describe(data)])

    problems = _field_problems(data, TOP_FIELDS, '')
    for key in ('apiVersion', 'kind', 'id', 'state', 'approvedBy', 'sourceRevision'):
        _want_str(data, key, '', problems)
    for key, want in (('apiVersion', API_VERSION), ('kind', KIND)):
        if isinstance(data.get(key), str) and data[key] != want:
            problems.append('%s must be %s, got %s' % (key, show(want), show(data[key])))
    if 'hardware' in data:
        if not isinstance(data['hardware'], list):
            problems.append('field "hardware" must be a list, got %s' % _describe(data['hardware']))
        else:
            for i, item in enumerate(data['hardware']):
                if not isinstance(item, str):
                    problems.append('field "hardware[%d]" must be a string, got %s' % (i, _describe(item)))
    if _want_mapping(data, 'target', problems):
        problems.extend(_field_problems(data['target'], RECORD_COMPONENTS, 'target'))
        for key in RECORD_COMPONENTS:
            _want_str(data['target'], key, 'target', problems)
    completed_at = None
    if _want_mapping(data, 'canary', problems):
        canary = data['canary']
        problems.extend(_field_problems(canary, CANARY_FIELDS, 'canary'))
        for key in CANARY_RESULTS:
            if key in canary and not isinstance(canary[key], bool):
                problems.append('field %s must be a boolean (true or false), got %s'
                                % (show('canary.' + key), _describe(canary[key])))
        _want_str(canary, 'evidence', 'canary', problems)
        if 'completedAt' in canary:
            value = canary['completedAt']
            try:
                if not isinstance(value, str):
                    raise ValueError(value)
                completed_at = parse_timestamp(value)
            except ValueError:
                problems.append('field "canary.completedAt" must be an RFC 3339 timestamp with an offset '
                                '(e.g. 2026-07-14T12:00:00Z), got %s' % _describe(value))
    if problems:
        raise QualificationError(problems)
    canary = data['canary']
    return Record(
        id=data['id'], state=data['state'], approved_by=data['approvedBy'],
        source_revision=data['sourceRevision'], hardware=tuple(data['hardware']),
        target=dict((k, data['target'][k]) for k in RECORD_COMPONENTS),
        completed_at=t.cast(datetime.datetime, completed_at),
        allocation_passed=canary['allocationPassed'], monitoring_passed=canary['monitoringPassed'],
        rollback_passed=canary['rollbackPassed'], evidence=canary['evidence'],
        api_version=data['apiVersion'], kind=data['kind'],
    )


def read_record_file(path: str) -> bytes:
    """Read at most MAX_RECORD_BYTES + 1 bytes (enough to refuse a larger file without reading
    it all); raise QualificationError naming the path when the file cannot be read."""
    try:
        with open(path, 'rb') as f:
            return f.read(MAX_RECORD_BYTES + 1)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, 'strerror', None) or str(exc)
        raise QualificationError(['cannot read the qualification record %s: %s' % (show(path, limit=PATH_MAX), reason)])


# --- rules ----------------------------------------------------------------------------------

def _blank(value: t.Any) -> bool:
    return not isinstance(value, str) or not value.strip()


def _identity_problems(record: Record) -> t.List[str]:
    """Rule 1: id, state, approver, revision."""
    problems = []
    if not _ID_RE.fullmatch(record.id):
        problems.append('id %s must be lowercase letters and digits, with "." or "-" only inside' % show(record.id))
    if record.state != 'qualified':
        problems.append('state must be "qualified", got %s' % show(record.state))
    if _blank(record.approved_by):
        problems.append('approvedBy is required')
    if not _REVISION_RE.fullmatch(record.source_revision):
        problems.append('sourceRevision must be 40 hexadecimal characters, got %s' % show(record.source_revision.lower()))
    return problems


def record_problems(record: Record) -> t.List[str]:
    """The rules that judge a record alone: 1, the record side of 2, and 7."""
    problems = _identity_problems(record)
    # Rule 2, record side
    _ids, pci_problems = _pci.normalize_all(list(record.hardware), prefix='record ')
    problems.extend(pci_problems)
    if not record.hardware:
        problems.append('record hardware must list at least one PCI id')
    # Rule 7
    problems.extend(_canary_result_problems(record))
    return problems


def _canary_result_problems(record: Record) -> t.List[str]:
    problems = []
    if not (record.allocation_passed is True and record.monitoring_passed is True and record.rollback_passed is True):
        problems.append('canary checks must all pass')
    if _blank(record.evidence):
        problems.append('canary evidence is required')
    return problems


def _tuple_problems(side: str, values: t.Any) -> t.Tuple[t.Dict[str, str], t.List[str]]:
    """Validate a module-side tuple dict (snake_case keys); return (record-named values, problems)."""
    if not isinstance(values, dict):
        return {}, ['%s must be a mapping of %s, got %s' % (side, ', '.join(MODULE_COMPONENTS), _describe(values))]
    problems = []
    for key in values:
        if key not in MODULE_COMPONENTS:
            problems.append('%s has an unknown component %s' % (side, show(key)))
    out = {}
    for snake, name in COMPONENTS:
        value = values.get(snake)
        if value is not None and not isinstance(value, str):
            problems.append('%s %s must be a string, got %s' % (side, name, _describe(value)))
        elif _blank(value):
            problems.append('%s %s is required' % (side, name))
        else:
            out[name] = value
    return out, problems


def age_problems(record: Record, max_canary_age_seconds: t.Union[int, str] = DEFAULT_MAX_CANARY_AGE,
                 now: t.Optional[datetime.datetime] = None) -> t.List[str]:
    """Rule 6: the canary completed neither in the future nor longer ago than the maximum age."""
    if now is None:
        now = datetime.datetime.now(datetime.timezone.utc)
    elif now.tzinfo is None:
        now = now.replace(tzinfo=datetime.timezone.utc)
    problems = []  # type: t.List[str]
    if record.completed_at > now + FUTURE_SKEW:
        problems.append('canary completion time is in the future')
    try:
        if isinstance(max_canary_age_seconds, str):
            age_text = max_canary_age_seconds.strip()
            max_age = _duration.parse(max_canary_age_seconds, 'max_canary_age')
        elif isinstance(max_canary_age_seconds, int) and not isinstance(max_canary_age_seconds, bool):
            if max_canary_age_seconds <= 0:
                raise ValueError('max_canary_age %d must be positive' % max_canary_age_seconds)
            max_age = max_canary_age_seconds
            age_text = _duration.format_seconds(max_age)
        else:
            raise ValueError('max_canary_age %s is not a duration' % show(max_canary_age_seconds))
    except ValueError as exc:
        problems.append(str(exc))
    else:
        # Integer microseconds: exact at the boundary, no overflow for huge limits.
        age_us = (now - record.completed_at) // datetime.timedelta(microseconds=1)
        if age_us > max_age * 1000000:
            problems.append('canary evidence is older than %s' % age_text)
    return problems


def hardware_problems(record: Record, pci_ids: t.Any) -> t.List[str]:
    """Rule 2: the node's PCI ids and the record's hardware are valid and the same set."""
    problems = []
    record_ids, record_pci = _pci.normalize_all(list(record.hardware), prefix='record ')
    node_ids, node_pci = _pci.normalize_all(pci_ids)
    problems.extend(node_pci)
    problems.extend(record_pci)
    if not _pci.split_items(pci_ids):
        problems.append('pci_ids must list at least one PCI id')
    if not record.hardware:
        problems.append('record hardware must list at least one PCI id')
    if record_ids != node_ids:
        problems.append('hardware tuple mismatch')
    return problems


def check_gate(record_text: t.Union[str, bytes], pci_ids: t.Any, current: t.Any, target: t.Any,
               max_canary_age_seconds: t.Union[int, str] = DEFAULT_MAX_CANARY_AGE,
               now: t.Optional[datetime.datetime] = None) -> GateResult:
    """Judge the live tuple against the record; every problem is collected.

    ``max_canary_age_seconds`` is seconds (int) or a duration string (``720h``, ``30d``); ``now``
    (timezone-aware; naive is taken as UTC) defaults to the current time.
    """
    try:
        record = parse_record(record_text)
    except QualificationError as exc:
        return GateResult(False, exc.problems)

    if now is None:
        now = datetime.datetime.now(datetime.timezone.utc)
    elif now.tzinfo is None:
        now = now.replace(tzinfo=datetime.timezone.utc)

    problems = []
    # Rule 1
    problems.extend(_identity_problems(record))
    # Rule 2
    problems.extend(hardware_problems(record, pci_ids))
    # Rule 3
    cur, cur_problems = _tuple_problems('current', current)
    tgt, tgt_problems = _tuple_problems('target', target)
    problems.extend(cur_problems)
    problems.extend(tgt_problems)
    for name in RECORD_COMPONENTS:
        if name in tgt and tgt[name] != record.target[name]:
            problems.append('%s target %s is not the qualified value %s' % (name, show(tgt[name]), show(record.target[name])))
    # Rule 4
    if len(cur) == len(tgt) == len(RECORD_COMPONENTS) and cur == tgt:
        problems.append('at least one component must change')
    # Rule 5
    versions = {}
    for side, values in (('current', cur), ('target', tgt)):
        if 'rke2' in values:
            try:
                versions[side] = _rke2.parse(values['rke2'])
            except ValueError as exc:
                problems.append('%s rke2: %s' % (side, exc))
    if len(versions) == 2:
        problems.extend(_rke2.transition_problems(versions['current'], versions['target']))
    # Rule 6
    problems.extend(age_problems(record, max_canary_age_seconds, now))
    # Rule 7
    problems.extend(_canary_result_problems(record))

    if problems:
        return GateResult(False, problems, record=record)
    return GateResult(True, [], qualification=record.summary(), record=record)


def validate_record(record_text: t.Union[str, bytes]) -> t.Tuple[t.Optional[Record], t.List[str]]:
    """Load and judge a record alone (``qualification_info``): (record or None, problems)."""
    try:
        record = parse_record(record_text)
    except QualificationError as exc:
        return None, exc.problems
    return record, record_problems(record)


# --- writing --------------------------------------------------------------------------------

_DUMPER_CLASS = None  # type: t.Any


def _dumper_class() -> t.Any:
    global _DUMPER_CLASS
    if _DUMPER_CLASS is None:
        class RecordDumper(yaml.SafeDumper):
            def ignore_aliases(self, data: t.Any) -> bool:
                return True

        def represent_str(dumper: t.Any, data: str) -> t.Any:
            # PyYAML writes NEL, LS, PS and BOM raw in plain and single-quoted scalars, where a
            # reader takes them for line breaks: double quotes escape them.
            style = '"' if any(ch in data for ch in '\x85\u2028\u2029\ufeff') else None
            return dumper.represent_scalar('tag:yaml.org,2002:str', data, style=style)

        RecordDumper.add_representer(str, represent_str)

        # Timestamps stay plain (as in seed 004): the loader never resolves them either. Every
        # other YAML 1.1 type stays quoted when it is a string, so other parsers read strings too.
        RecordDumper.yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in entries if tag != 'tag:yaml.org,2002:timestamp']
            for first, entries in yaml.SafeDumper.yaml_implicit_resolvers.items()}
        _DUMPER_CLASS = RecordDumper
    return _DUMPER_CLASS


def dump_record(record: t.Union[Record, t.Dict[str, t.Any]]) -> str:
    """Write a record (a Record, or a dict in the seed schema; ``completedAt`` may be a datetime)
    as YAML in the seed's field order; raise QualificationError if the result would not load."""
    if yaml is None:
        raise QualificationError(['the PyYAML Python library is required to write qualification records'])
    data = record.to_dict() if isinstance(record, Record) else record
    if not isinstance(data, dict):
        raise QualificationError(['the record must be a mapping, got %s' % _describe(data)])

    def ordered(value: t.Any, order: t.Sequence[str]) -> t.Any:
        if not isinstance(value, dict):
            return value
        out = {k: value[k] for k in order if k in value}
        out.update((k, v) for k, v in value.items() if k not in out)
        return out

    doc = ordered(data, TOP_FIELDS)
    if 'target' in doc:
        doc['target'] = ordered(doc['target'], RECORD_COMPONENTS)
    if 'canary' in doc:
        doc['canary'] = ordered(doc['canary'], CANARY_FIELDS)
        if isinstance(doc['canary'], dict) and isinstance(doc['canary'].get('completedAt'), datetime.datetime):
            doc['canary']['completedAt'] = format_timestamp(doc['canary']['completedAt'])
    if isinstance(doc.get('hardware'), tuple):
        doc['hardware'] = list(doc['hardware'])
    try:
        text = yaml.dump(doc, Dumper=_dumper_class(), sort_keys=False, default_flow_style=False,
                         allow_unicode=True, width=4096)
    except yaml.YAMLError as exc:
        raise QualificationError(['the record cannot be written as YAML: %s' % exc])
    parse_record(text)  # raises QualificationError with every problem
    if _load_yaml(text) != doc:
        raise QualificationError(['the record cannot be written faithfully as YAML'])
    return text
