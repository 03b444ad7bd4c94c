"""Property tests: whatever the record text and the arguments, the gate answers PASS or a clean
list of problems, and never raises. Thousands of generated and mutated records and argument sets.
"""
from __future__ import annotations

import datetime

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _pci, _qualification as q
from tools.records import CURRENT, NOW, PCI_IDS, SEED, SEED_TEXT, TARGET

PROPERTY = settings(max_examples=1000, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROPERTY_SMALL = settings(PROPERTY, max_examples=500)

YAML_PIECES = list('&*!|>:-?,[]{}#%@`\'"\\ \t\n~.+') + [
    '<<', '---', '...', '\r', '\x00', 'é', '\ufeff', 'true', 'yes', 'null', '0x1f', '!!str ', '&a ', '*a']
YAML_CHARS = st.sampled_from(YAML_PIECES)
SAMPLE_STRINGS = ['true', 'qualified', '10de:1db6/10de:124a', 'v1.36.1+rke2r1', '2026-07-14T12:00:00Z', 'a' * 40, '', ' ']
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=30), st.sampled_from(SAMPLE_STRINGS))


def _containers(inner):
    return st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4))


VALUES = st.recursive(SCALARS, _containers, max_leaves=12)
DURATIONS = st.one_of(st.sampled_from(['720h', '30d', '90m', '10s', '0h', '-1h', '1.5h', '', 'h', '1w', '99999999999999999999d']),
                      st.text(max_size=8), st.integers(min_value=-10, max_value=10 ** 12), st.none())
NOWS = st.one_of(st.just(NOW), st.just(None),
                 st.datetimes(min_value=datetime.datetime(1, 1, 2), max_value=datetime.datetime(9999, 12, 30),
                              timezones=st.just(datetime.timezone.utc)),
                 st.datetimes(min_value=datetime.datetime(1, 1, 2), max_value=datetime.datetime(9999, 12, 30)))
PCI_ITEMS = st.one_of(st.sampled_from(['10de:1db6/10de:124a', '10DE:1DB6/10DE:124A ', '10de:2330/10de:16c1',
                                       '10de:1db6/10de:124a,10de:2330/10de:16c1', '', ',', 'x']),
                      st.text(max_size=25), st.integers(), st.none())
PCI_LISTS = st.one_of(st.just(PCI_IDS), st.lists(PCI_ITEMS, max_size=4), st.text(max_size=25), st.none())


def tuples(base):
    keys = st.sampled_from(list(base) + ['cuda', ''])
    return st.one_of(st.just(dict(base)), st.builds(lambda changes: dict(base, **changes),
                                                    st.dictionaries(keys, st.one_of(SCALARS, st.text(max_size=20)), max_size=3)),
                     VALUES)


def assert_clean(result):
    """PASS, or a list of single-line, non-empty problem strings; never a traceback."""
    assert isinstance(result, q.GateResult)
    assert isinstance(result.passed, bool)
    assert isinstance(result.problems, list)
    assert result.passed is (result.problems == [])
    for problem in result.problems:
        assert isinstance(problem, str) and problem.strip()
        assert 'Traceback' not in problem
        assert '\n' not in problem
    if result.passed:
        assert result.msg.startswith('GPU upgrade gate: PASS')
        assert result.msg.endswith(q.PASS_REMINDER)
        assert set(result.qualification) == {'id', 'approved_by', 'source_revision', 'completed_at'}
    else:
        assert result.qualification is None
        assert result.msg == 'GPU upgrade blocked: ' + '; '.join(result.problems)


def assert_pass_is_earned(result, pci_ids, target):
    """A PASS implies the live tuple is exactly the record's."""
    if not result.passed:
        return
    record = result.record
    assert _pci.normalize_all(pci_ids)[0] == _pci.normalize_all(list(record.hardware))[0]
    assert {name: target[snake] for snake, name in q.COMPONENTS} == record.target
    assert record.state == 'qualified' and record.allocation_passed and record.monitoring_passed and record.rollback_passed


@st.composite
def mutated_seed(draw):
    text = SEED_TEXT
    for _step in range(draw(st.integers(min_value=1, max_value=4))):
        pos = draw(st.integers(min_value=0, max_value=len(text)))
        op = draw(st.sampled_from(['insert', 'delete', 'replace']))
        piece = draw(st.one_of(YAML_CHARS, st.text(max_size=3)))
        if op == 'insert':
            text = text[:pos] + piece + text[pos:]
        elif op == 'delete':
            text = text[:pos] + text[pos + draw(st.integers(min_value=1, max_value=12)):]
        else:
            text = text[:pos] + piece + text[pos + len(piece):]
    return text


@st.composite
def structured_record(draw):
    """The seed with fields replaced, removed or added at every level, dumped as plain YAML."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SEED.items()}
    for _step in range(draw(st.integers(min_value=0, max_value=4))):
        section = draw(st.sampled_from([None, 'target', 'canary']))
        where = data if section is None or not isinstance(data.get(section), dict) else data[section]
        key = draw(st.one_of(st.sampled_from(sorted(where) or ['x']), st.text(max_size=10)))
        op = draw(st.sampled_from(['set', 'set', 'delete']))
        if op == 'delete':
            where.pop(key, None)
        else:
            where[key] = draw(VALUES)
    return yaml.safe_dump(data, sort_keys=draw(st.booleans()), default_flow_style=draw(st.sampled_from([None, True, False])),
                          allow_unicode=True)


@PROPERTY
@given(mutated_seed(), PCI_LISTS, tuples(CURRENT), tuples(TARGET), DURATIONS, NOWS)
def test_mutated_records_never_raise(record_text, pci_ids, current, target, max_age, now):
    result = q.check_gate(record_text, pci_ids, current, target, max_age, now)
    assert_clean(result)
    assert_pass_is_earned(result, pci_ids, target)


@PROPERTY
@given(structured_record(), PCI_LISTS, tuples(CURRENT), tuples(TARGET), DURATIONS, NOWS)
def test_generated_records_never_raise(record_text, pci_ids, current, target, max_age, now):
    result = q.check_gate(record_text, pci_ids, current, target, max_age, now)
    assert_clean(result)
    assert_pass_is_earned(result, pci_ids, target)


@PROPERTY_SMALL
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300), VALUES.map(yaml.safe_dump)))
def test_arbitrary_text_never_raises(record_text):
    assert_clean(q.check_gate(record_text, PCI_IDS, CURRENT, TARGET, '720h', NOW))
    record, problems = q.validate_record(record_text)
    assert all(isinstance(p, str) and p and '\n' not in p for p in problems)
    assert record is not None or problems


@PROPERTY_SMALL
@given(st.fixed_dictionaries({
    'id': st.from_regex(r'\A[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?\Z'),
    'approvedBy': st.text(min_size=1, max_size=30).filter(str.strip),
    'sourceRevision': st.from_regex(r'\A[0-9a-fA-F]{40}\Z'),
    'hardware': st.lists(st.from_regex(r'\A[0-9a-fA-F]{4}:[0-9a-fA-F]{4}/[0-9a-fA-F]{4}:[0-9a-fA-F]{4}\Z'),
                         min_size=1, max_size=4, unique_by=str.lower),
    'versions': st.lists(st.text(min_size=1, max_size=30).filter(str.strip), min_size=5, max_size=5),
    'completedAt': st.datetimes(min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2100, 1, 1),
                                timezones=st.sampled_from([datetime.timezone.utc,
                                                           datetime.timezone(datetime.timedelta(hours=5, minutes=30))])),
    'evidence': st.text(min_size=1, max_size=40).filter(str.strip),
}))
def test_written_records_round_trip_and_pass_their_own_tuple(fields):
    versions = fields.pop('versions')
    versions[1] = 'v1.36.1+rke2r1'
    data = dict(SEED, id=fields['id'], approvedBy=fields['approvedBy'], sourceRevision=fields['sourceRevision'],
                hardware=fields['hardware'], target=dict(zip(q.RECORD_COMPONENTS, versions)),
                canary=dict(SEED['canary'], completedAt=fields['completedAt'], evidence=fields['evidence']))
    text = q.dump_record(data)
    record = q.parse_record(text)
    assert q.parse_record(q.dump_record(record)).to_dict() == record.to_dict()
    assert record.target == dict(zip(q.RECORD_COMPONENTS, versions))
    assert record.completed_at == fields['completedAt']
    target = {snake: record.target[name] for snake, name in q.COMPONENTS}
    current = dict(target, rke2='v1.35.9+rke2r1')
    result = q.check_gate(text, [h.upper() for h in fields['hardware']], current, target, '720h',
                          fields['completedAt'] + datetime.timedelta(hours=1))
    assert result.problems == []
    assert result.qualification['source_revision'] == fields['sourceRevision'].lower()


# Review 2026-12-06 T3-13: a sexagesimal number of any length (up to 500 parts: 175 made PyYAML's float
# constructor overflow) in any field is a problem naming the field, never a traceback.
SEXAGESIMAL_LINES = ['id: v100-kernel-canary-1', 'driver: 580.130.00', 'evidence: change-record-42',
                     'rollbackPassed: true', 'completedAt: 2026-07-14T12:00:00Z', '  - 10de:1db6/10de:124a']


@settings(PROPERTY, max_examples=200)
@given(st.sampled_from(SEXAGESIMAL_LINES), st.sampled_from(['', '-', '+']),
       st.integers(min_value=2, max_value=500), st.lists(st.integers(min_value=0, max_value=59), min_size=1, max_size=5),
       st.sampled_from(['', '.5', '.0', '.25']))
def test_sexagesimal_numbers_of_any_length_never_raise(line, sign, count, pattern, fraction):
    key = line.split(':', 1)[0] + (': ' if not line.strip().startswith('-') else '')
    value = sign + '1:' + ':'.join('%d' % pattern[i % len(pattern)] for i in range(count)) + fraction
    doc = SEED_TEXT.replace(line, (key if key.endswith(': ') else '  - ') + value)
    assert doc != SEED_TEXT
    result = q.check_gate(doc, PCI_IDS, CURRENT, TARGET, '720h', NOW)
    assert_clean(result)
    assert result.passed is False
    record, problems = q.validate_record(doc)
    assert record is None and problems == result.problems
