"""The qualification record loader and the upgrade gate: every rule and boundary of issue 2."""
from __future__ import annotations

import datetime

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q
from tools.records import CURRENT, NOW, PCI_IDS, SEED_COMPLETED_AT, SEED_TEXT, TARGET, seed_dict, text, timestamp, with_canary, with_target

UTC = datetime.timezone.utc


def load_problems(record_text):
    with pytest.raises(q.QualificationError) as err:
        q.parse_record(record_text)
    return err.value.problems


def gate(record_text=SEED_TEXT, pci_ids=None, current=None, target=None, max_age='720h', now=NOW):
    return q.check_gate(record_text, list(PCI_IDS) if pci_ids is None else pci_ids,
                        dict(CURRENT) if current is None else current,
                        dict(TARGET) if target is None else target, max_age, now)


def problems_of(record=None, **kwargs):
    result = gate(text(record) if isinstance(record, dict) else (record or SEED_TEXT), **kwargs)
    assert result.passed is (not result.problems)
    return result.problems


# --- loading ------------------------------------------------------------------------------

def test_seed_record_loads_with_exact_values():
    record = q.parse_record(SEED_TEXT)
    assert record.id == 'v100-kernel-canary-1'
    assert record.state == 'qualified'
    assert record.approved_by == 'platform-review'
    assert record.source_revision == 'a' * 40
    assert record.hardware == ('10de:1db6/10de:124a',)
    assert record.target == {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'driver': '580.130.00',
                             'gpuOperator': 'v26.3.4', 'dcgmExporter': '4.4.1-4.6.0-ubuntu22.04'}
    assert record.completed_at == SEED_COMPLETED_AT
    assert (record.allocation_passed, record.monitoring_passed, record.rollback_passed) == (True, True, True)
    assert record.evidence == 'change-record-42'


def _padded(size, base=SEED_TEXT):
    """The seed record padded with a trailing comment to exactly `size` bytes."""
    pad = size - len(base.encode()) - 3
    out = base + '#' + 'x' * pad + '\n\n'
    assert len(out.encode()) == size
    return out


def test_record_of_exactly_65536_bytes_is_accepted():
    assert q.parse_record(_padded(65536)).id == 'v100-kernel-canary-1'
    assert q.parse_record(_padded(65536).encode()).id == 'v100-kernel-canary-1'


def test_record_of_65537_bytes_is_rejected():
    assert load_problems(_padded(65537)) == ['the record is larger than 65536 bytes']
    assert load_problems(_padded(65537).encode()) == ['the record is larger than 65536 bytes']


def test_size_counts_utf8_bytes_not_characters():
    base = SEED_TEXT.replace('evidence: change-record-42', 'evidence: "' + 'é' * 32800 + '"')
    assert len(base) < 65536 < len(base.encode())
    assert load_problems(base) == ['the record is larger than 65536 bytes']


def test_read_record_file_reads_one_byte_past_the_limit(tmp_path):
    big = tmp_path / 'big.yaml'
    big.write_bytes(_padded(65536).encode() + b'#' * 1000000)
    data = q.read_record_file(str(big))
    assert len(data) == 65537
    assert load_problems(data) == ['the record is larger than 65536 bytes']


def test_read_record_file_names_a_missing_path(tmp_path):
    with pytest.raises(q.QualificationError) as err:
        q.read_record_file(str(tmp_path / 'nope.yaml'))
    assert err.value.problems == ['cannot read the qualification record "%s": No such file or directory' % (tmp_path / 'nope.yaml')]


def test_read_record_file_names_a_long_path_whole(tmp_path):
    path = tmp_path / ('d' * 150) / 'nope.yaml'
    with pytest.raises(q.QualificationError) as err:
        q.read_record_file(str(path))
    assert err.value.problems == ['cannot read the qualification record "%s": No such file or directory' % path]


@pytest.mark.parametrize('doc', [
    SEED_TEXT + '---\n' + SEED_TEXT,
    SEED_TEXT + '...\n---\n' + 'id: other\n',
    SEED_TEXT + '--- {id: other}\n',
    SEED_TEXT + '---\n',
    '---\n' + SEED_TEXT + '---\n!!python/object/apply:os.system ["true"]\n',
])
def test_multiple_documents_are_rejected(doc):
    assert load_problems(doc) == ['multiple YAML documents are not allowed']


def test_one_explicit_document_is_accepted():
    assert q.parse_record('---\n' + SEED_TEXT + '...\n').id == 'v100-kernel-canary-1'


def test_unknown_fields_at_every_level_are_all_reported():
    data = seed_dict(extra=1)
    data['target']['cuda'] = '13.0'
    data['canary']['notes'] = 'x'
    assert load_problems(text(data)) == [
        'unknown field "extra"', 'unknown field "target.cuda"', 'unknown field "canary.notes"']


def test_missing_fields_are_reported():
    data = seed_dict()
    del data['approvedBy']
    del data['target']['rke2']
    del data['canary']['evidence']
    assert load_problems(text(data)) == [
        'missing field "approvedBy"', 'missing field "target.rke2"', 'missing field "canary.evidence"']


def test_merge_key_is_an_unknown_field_not_a_merge():
    doc = SEED_TEXT.replace('target:\n', 'target:\n  <<: {kernel: x}\n')
    assert load_problems(doc) == ['unknown field "target.<<"']


@pytest.mark.parametrize('doc,expected', [
    (SEED_TEXT + 'id: again\n', ['duplicate field "id" (line 21)']),
    (SEED_TEXT.replace('  evidence: change-record-42\n', '  evidence: a\n  evidence: b\n'),
     ['duplicate field "canary.evidence" (line 21)']),
    (SEED_TEXT.replace('  kernel: 6.8.0-135-generic\n', '  kernel: 6.8.0-135-generic\n  "kernel": 6.8.0-135-generic\n')
     + 'state: qualified\n', ['duplicate field "target.kernel" (line 11)', 'duplicate field "state" (line 22)']),
])
def test_duplicate_keys_are_rejected(doc, expected):
    assert load_problems(doc) == expected


def test_anchors_are_rejected():
    doc = SEED_TEXT.replace('evidence: change-record-42', 'evidence: &ev change-record-42')
    assert load_problems(doc) == ['YAML anchors are not allowed: "&ev" at canary.evidence (line 20)']


def test_alias_without_anchor_is_rejected_as_alias():
    doc = SEED_TEXT.replace('evidence: change-record-42', 'evidence: *ev')
    assert load_problems(doc) == ['YAML aliases are not allowed: "*ev" at canary.evidence (line 20)']


def _alias_bomb(limit=65536):
    lines = ['a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]']
    i = 1
    while True:
        line = 'a%d: &a%d [%s]' % (i, i, ', '.join(['*a%d' % (i - 1)] * 9))
        if len('\n'.join(lines + [line]).encode()) + 1 > limit:
            break
        lines.append(line)
        i += 1
    return '\n'.join(lines) + '\n', i


def test_alias_bomb_is_rejected_before_construction(monkeypatch):
    bomb, levels = _alias_bomb()
    assert levels > 9 and len(bomb.encode()) <= 65536  # 9**levels nodes if it expanded
    loader = q._loader_class()

    def no_construction(self, node):  # the one spy: construction must never start
        raise AssertionError('constructed a document with anchors')
    monkeypatch.setattr(loader, 'construct_document', no_construction)
    assert load_problems(bomb) == ['YAML anchors are not allowed: "&a0" at a0 (line 1)']
    assert gate(bomb).problems == ['YAML anchors are not allowed: "&a0" at a0 (line 1)']


@pytest.mark.parametrize('replacement,tag', [
    ('evidence: !custom change-record-42', '!custom'),
    ('evidence: !!python/object/apply:os.system ["true"]', 'tag:yaml.org,2002:python/object/apply:os.system'),
    ('evidence: !!binary aGVsbG8=', 'tag:yaml.org,2002:binary'),
    ('evidence: !!int "42"', 'tag:yaml.org,2002:int'),
    ('evidence: !!timestamp 2026-07-14', 'tag:yaml.org,2002:timestamp'),
    ('evidence: ! change-record-42', '!'),
    ('evidence: !!seq {}', 'tag:yaml.org,2002:seq'),
    ('evidence: !!map []', 'tag:yaml.org,2002:map'),
])
def test_custom_and_non_string_tags_are_rejected(replacement, tag):
    doc = SEED_TEXT.replace('evidence: change-record-42', replacement)
    assert load_problems(doc) == ['YAML tag "%s" is not allowed at canary.evidence (line 20)' % tag]


def test_str_tag_is_a_string():
    doc = SEED_TEXT.replace('driver: 580.130.00', 'driver: !!str 580.130.00')
    assert q.parse_record(doc).target['driver'] == '580.130.00'


def test_deep_nesting_is_refused_without_recursion():
    assert load_problems('[' * 60000) == ['the record nests deeper than 8 levels at [0][0][0][0][0][0][0][0] (line 1)']


@pytest.mark.parametrize('value,shown', [
    ('"true"', 'the string "true"'),
    ("'false'", 'the string "false"'),
    ('yes', 'the string "yes"'),
    ('on', 'the string "on"'),
    ('1', 'the number 1'),
    ('null', 'null'),
    ('', 'null'),
    ('[true]', 'a list'),
])
def test_canary_results_must_be_yaml_booleans(value, shown):
    doc = SEED_TEXT.replace('allocationPassed: true', 'allocationPassed: ' + value)
    assert load_problems(doc) == ['field "canary.allocationPassed" must be a boolean (true or false), got ' + shown]


@pytest.mark.parametrize('value', ['true', 'True', 'TRUE'])
def test_true_spellings_are_booleans(value):
    doc = SEED_TEXT.replace('rollbackPassed: true', 'rollbackPassed: ' + value)
    assert q.parse_record(doc).rollback_passed is True


@pytest.mark.parametrize('field,value,shown', [
    ('driver', '580.13', 'the number 580.13 (quote it)'),
    ('driver', '580', 'the number 580 (quote it)'),
    ('kernel', 'null', 'null (quote it)'),
    ('gpuOperator', 'true', 'the boolean true (quote it)'),
    ('dcgmExporter', '[a]', 'a list'),
])
def test_version_fields_must_be_strings(field, value, shown):
    doc = SEED_TEXT
    for line in doc.splitlines():
        if line.startswith('  %s: ' % field):
            doc = doc.replace(line, '  %s: %s' % (field, value))
    assert load_problems(doc) == ['field "target.%s" must be a string, got %s' % (field, shown)]


def test_types_of_every_field_are_checked_together():
    data = seed_dict(id=7, state=None, approvedBy=['x'], sourceRevision=1.5, hardware='10de:1db6/10de:124a', canary=[])
    data['target'] = 'x'
    assert load_problems(text(data)) == [
        'field "id" must be a string, got the number 7 (quote it)',
        'field "state" must be a string, got null (quote it)',
        'field "approvedBy" must be a string, got a list',
        'field "sourceRevision" must be a string, got the number 1.5 (quote it)',
        'field "hardware" must be a list, got the string "10de:1db6/10de:124a"',
        'field "target" must be a mapping, got the string "x"',
        'field "canary" must be a mapping, got a list',
    ]


def test_hardware_items_must_be_strings():
    assert load_problems(text(seed_dict(hardware=['10de:1db6/10de:124a', 42]))) == [
        'field "hardware[1]" must be a string, got the number 42']


@pytest.mark.parametrize('field,value', [('apiVersion', 'kube-dc.io/v1'), ('kind', 'GPUUpgradeQualifications')])
def test_api_version_and_kind_are_exact(field, value):
    want = {'apiVersion': 'kube-dc.io/v1alpha1', 'kind': 'GPUUpgradeQualification'}[field]
    assert load_problems(text(seed_dict(**{field: value}))) == ['%s must be "%s", got "%s"' % (field, want, value)]


@pytest.mark.parametrize('value,expected', [
    ('2026-07-14T12:00:00Z', datetime.datetime(2026, 7, 14, 12, tzinfo=UTC)),
    ("'2026-07-14T12:00:00Z'", datetime.datetime(2026, 7, 14, 12, tzinfo=UTC)),
    ('"2026-07-14T14:30:00+02:30"', datetime.datetime(2026, 7, 14, 12, tzinfo=UTC)),
    ('2026-07-14T07:00:00-05:00', datetime.datetime(2026, 7, 14, 12, tzinfo=UTC)),
    ('2026-07-14t12:00:00.123456789z', datetime.datetime(2026, 7, 14, 12, 0, 0, 123456, tzinfo=UTC)),
    ('2026-07-14T12:00:00-00:00', datetime.datetime(2026, 7, 14, 12, tzinfo=UTC)),
])
def test_completed_at_is_rfc3339_with_offset_quoted_or_not(value, expected):
    doc = SEED_TEXT.replace('completedAt: 2026-07-14T12:00:00Z', 'completedAt: ' + value)
    assert q.parse_record(doc).completed_at == expected


@pytest.mark.parametrize('value,shown', [
    ('2026-07-14T12:00:00', 'the string "2026-07-14T12:00:00"'),
    ('2026-07-14', 'the string "2026-07-14"'),
    ('2026-07-14 12:00:00Z', 'the string "2026-07-14 12:00:00Z"'),
    ('2026-02-30T12:00:00Z', 'the string "2026-02-30T12:00:00Z"'),
    ('2026-07-14T12:00:60Z', 'the string "2026-07-14T12:00:60Z"'),
    ('2026-07-14T12:00:00+24:00', 'the string "2026-07-14T12:00:00+24:00"'),
    ('9999-12-31T23:59:59-01:00', 'the string "9999-12-31T23:59:59-01:00"'),
    ('1783425600', 'the number 1783425600'),
])
def test_completed_at_without_offset_or_invalid_is_rejected(value, shown):
    doc = SEED_TEXT.replace('completedAt: 2026-07-14T12:00:00Z', 'completedAt: ' + value)
    assert load_problems(doc) == [
        'field "canary.completedAt" must be an RFC 3339 timestamp with an offset (e.g. 2026-07-14T12:00:00Z), got ' + shown]


@pytest.mark.parametrize('doc,expected', [
    ('', 'the record is empty'),
    ('# only a comment\n', 'the record is empty'),
    ('- a\n', 'the record must be a YAML mapping, got a list'),
    ('just text\n', 'the record must be a YAML mapping, got the string "just text"'),
    ('a: [1\n', 'the record is not valid YAML: expected \',\' or \']\', but got \'<stream end>\' (line 2, column 1)'),
    ('a: 1\n b: 2\n', 'the record is not valid YAML: mapping values are not allowed here (line 2, column 3)'),
    ('a: "\x07"\n', 'the record is not valid YAML: unacceptable character #x0007 at position 4'),
    ('? [a]\n: 1\n', 'mapping keys must be plain strings at the record (line 1)'),
])
def test_malformed_yaml_is_one_clear_problem(doc, expected):
    assert load_problems(doc) == [expected]


def test_invalid_utf8_is_rejected():
    assert load_problems(SEED_TEXT.encode() + b'#\xff\n') == ['the record is not valid UTF-8 (byte %d)' % (len(SEED_TEXT) + 1)]


def test_loading_failure_checks_nothing_else():
    result = gate(SEED_TEXT + 'extra: 1\n', pci_ids=['bad'], current={}, target={}, max_age='0h')
    assert result.passed is False
    assert result.problems == ['unknown field "extra"']
    assert result.msg == 'GPU upgrade blocked: unknown field "extra"'


# --- the gate: PASS -------------------------------------------------------------------------

def test_seed_tuple_passes():
    result = gate()
    assert result.passed is True
    assert result.problems == []
    assert result.qualification == {
        'id': 'v100-kernel-canary-1', 'approved_by': 'platform-review',
        'source_revision': 'a' * 40, 'completed_at': '2026-07-14T12:00:00Z'}
    assert result.msg == (
        'GPU upgrade gate: PASS: qualification "v100-kernel-canary-1" approved by "platform-review", '
        'source revision %s, canary completed 2026-07-14T12:00:00Z. '
        'A PASS permits only the reviewed serialized canary/upgrade plan.' % ('a' * 40))
    assert result.msg.startswith('GPU upgrade gate: PASS')
    assert result.msg.endswith('A PASS permits only the reviewed serialized canary/upgrade plan.')


def test_default_now_is_the_current_time():
    fresh = text(with_canary(seed_dict(), completedAt=timestamp(datetime.datetime.now(UTC))))
    assert q.check_gate(fresh, PCI_IDS, CURRENT, TARGET).passed is True
    # now=None reads the clock: a canary 721 h old is past the 720 h limit, one 1 h old is within it.
    clock = datetime.datetime.now(UTC)
    stale = text(with_canary(seed_dict(), completedAt=timestamp(clock - datetime.timedelta(hours=721))))
    recent = text(with_canary(seed_dict(), completedAt=timestamp(clock - datetime.timedelta(hours=1))))
    blocked = gate(stale, now=None)
    assert blocked.passed is False
    assert blocked.problems == ['canary evidence is older than 720h']
    assert gate(recent, now=None).passed is True


def test_naive_now_is_utc():
    assert gate(now=NOW.replace(tzinfo=None)).passed is True


# --- rule 1 ---------------------------------------------------------------------------------

@pytest.mark.parametrize('value', ['V100-canary', '-canary', 'canary-', 'canary.', '.canary', 'can_ary', 'can ary', 'ñ', ''])
def test_rule1_id_format(value):
    assert problems_of(seed_dict(id=value)) == [
        'id "%s" must be lowercase letters and digits, with "." or "-" only inside' % value]


@pytest.mark.parametrize('value', ['a', '0', 'v100.kernel-canary.1', 'a--b..c'])
def test_rule1_id_accepted(value):
    assert problems_of(seed_dict(id=value)) == []


def test_rule1_state_must_be_qualified():
    assert problems_of(seed_dict(state='Qualified')) == ['state must be "qualified", got "Qualified"']


@pytest.mark.parametrize('value', ['', '   ', '\t\n'])
def test_rule1_approver_required(value):
    assert problems_of(seed_dict(approvedBy=value)) == ['approvedBy is required']


def test_rule1_revision_either_case_reported_lowercased():
    result = gate(text(seed_dict(sourceRevision='ABCDEF0123' * 4)))
    assert result.passed is True
    assert result.qualification['source_revision'] == 'abcdef0123' * 4


@pytest.mark.parametrize('value', ['A' * 39, 'a' * 41, 'g' * 40, ' ' + 'a' * 40])
def test_rule1_revision_must_be_40_hex(value):
    assert problems_of(seed_dict(sourceRevision=value)) == [
        'sourceRevision must be 40 hexadecimal characters, got "%s"' % value.lower()]


# --- rule 2 ---------------------------------------------------------------------------------

def test_rule2_case_folding_and_trimming_on_both_sides():
    assert problems_of(seed_dict(hardware=[' 10DE:1DB6/10de:124A\t']), pci_ids=['  10de:1DB6/10DE:124a ']) == []


def test_rule2_comma_separated_items():
    record = seed_dict(hardware=['10de:2330/10de:16c1', '10de:1db6/10de:124a'])
    assert problems_of(record, pci_ids=['10de:1db6/10de:124a, 10DE:2330/10de:16c1']) == []
    assert problems_of(record, pci_ids=['10de:1db6/10de:124a', '10de:2330/10de:16c1']) == []


def test_rule2_subset_is_a_mismatch():
    record = seed_dict(hardware=['10de:2330/10de:16c1', '10de:1db6/10de:124a'])
    assert problems_of(record, pci_ids=['10de:1db6/10de:124a']) == ['hardware tuple mismatch']


def test_rule2_superset_is_a_mismatch():
    assert problems_of(pci_ids=['10de:1db6/10de:124a', '10de:2330/10de:16c1']) == ['hardware tuple mismatch']


def test_rule2_other_hardware_is_a_mismatch():
    assert problems_of(pci_ids=['10de:1db6/10de:1249']) == ['hardware tuple mismatch']


def test_rule2_duplicates_on_both_sides():
    record = seed_dict(hardware=['10de:1db6/10de:124a', '10DE:1DB6/10DE:124A'])
    assert problems_of(record, pci_ids=['10de:1db6/10de:124a', '10de:1db6/10de:124A ']) == [
        'PCI id "10de:1db6/10de:124a" is listed more than once',
        'record PCI id "10de:1db6/10de:124a" is listed more than once',
    ]


@pytest.mark.parametrize('value', ['10de:1db6', '10de:1db6/10de:124', '10de-1db6/10de-124a', '10de:1db6/10de:124g',
                                   '10de:1db6 /10de:124a', '0x10de:1db6/10de:124a', ''])
def test_rule2_malformed_ids_on_both_sides(value):
    record = seed_dict(hardware=['10de:1db6/10de:124a', value])
    assert problems_of(record, pci_ids=['10de:1db6/10de:124a', value]) == [
        'PCI id "%s" is malformed: expected vendor:device/subvendor:subdevice in hex, e.g. 10de:1db6/10de:124a' % value,
        'record PCI id "%s" is malformed: expected vendor:device/subvendor:subdevice in hex, e.g. 10de:1db6/10de:124a' % value,
    ]


def test_rule2_empty_sides():
    assert problems_of(seed_dict(hardware=[]), pci_ids=[]) == [
        'pci_ids must list at least one PCI id', 'record hardware must list at least one PCI id']
    assert problems_of(pci_ids=[]) == ['pci_ids must list at least one PCI id', 'hardware tuple mismatch']


# --- rule 3 ---------------------------------------------------------------------------------

@pytest.mark.parametrize('snake,name,value', [
    ('kernel', 'kernel', '6.8.0-136-generic'),
    ('rke2', 'rke2', 'v1.36.2+rke2r1'),
    ('driver', 'driver', '580.130.01'),
    ('gpu_operator', 'gpuOperator', 'v26.3.5'),
    ('dcgm_exporter', 'dcgmExporter', '4.4.2-4.6.0-ubuntu22.04'),
])
def test_rule3_target_must_equal_the_record(snake, name, value):
    target = dict(TARGET, **{snake: value})
    assert problems_of(target=target) == ['%s target "%s" is not the qualified value "%s"' % (name, value, TARGET[snake])]


def test_rule3_byte_for_byte():
    assert problems_of(target=dict(TARGET, driver='580.130.00 ')) == [
        'driver target "580.130.00 " is not the qualified value "580.130.00"']
    assert problems_of(target=dict(TARGET, rke2='V1.36.1+rke2r1')) == [
        'rke2 target "V1.36.1+rke2r1" is not the qualified value "v1.36.1+rke2r1"',
        'target rke2: "V1.36.1+rke2r1" is not a valid RKE2 version: expected v1.MINOR.PATCH+rke2rREV']


def test_rule3_blank_and_missing_components():
    current = dict(CURRENT, kernel=' ')
    del current['driver']
    target = dict(TARGET, gpu_operator='')
    assert problems_of(current=current, target=target) == [
        'current kernel is required', 'current driver is required', 'target gpuOperator is required']


def test_rule3_unknown_components_and_types():
    assert problems_of(current=dict(CURRENT, cuda='13.0'), target=dict(TARGET, driver=580)) == [
        'current has an unknown component "cuda"', 'target driver must be a string, got the number 580']
    assert problems_of(current=['kernel'], target=TARGET) == [
        'current must be a mapping of kernel, rke2, driver, gpu_operator, dcgm_exporter, got a list']


# --- rule 4 ---------------------------------------------------------------------------------

def test_rule4_no_op_is_refused():
    assert problems_of(current=dict(TARGET)) == ['at least one component must change']


def test_rule4_exporter_only_change_is_allowed():
    record = with_target(seed_dict(), kernel=CURRENT['kernel'], rke2=CURRENT['rke2'], driver=CURRENT['driver'],
                         gpuOperator=CURRENT['gpu_operator'], dcgmExporter='4.5.0-4.7.0-ubuntu22.04')
    target = dict(CURRENT, dcgm_exporter='4.5.0-4.7.0-ubuntu22.04')
    assert problems_of(record, target=target) == []


# --- rule 5 ---------------------------------------------------------------------------------

def _rke2_case(current_rke2, target_rke2):
    record = with_target(seed_dict(), rke2=target_rke2)
    return problems_of(record, current=dict(CURRENT, rke2=current_rke2), target=dict(TARGET, rke2=target_rke2))


@pytest.mark.parametrize('current_rke2,target_rke2', [
    ('v1.35.3+rke2r3', 'v1.36.1+rke2r1'),   # +1 minor
    ('1.35.3+rke2r3', '1.36.1+rke2r1'),     # v optional on both sides
    ('v1.35.3+rke2r3', '1.36.1+rke2r1'),
    ('v1.36.1+rke2r1', 'v1.36.1+rke2r2'),   # rev bump
    ('v1.36.1+rke2r1', 'v1.36.1+rke2r1'),   # equal (another component changes)
    ('v1.36.9+rke2r9', 'v1.37.0+rke2r1'),
])
def test_rule5_allowed_hops(current_rke2, target_rke2):
    assert _rke2_case(current_rke2, target_rke2) == []


@pytest.mark.parametrize('current_rke2,target_rke2', [
    ('v1.36.1+rke2r1', 'v1.35.3+rke2r3'),
    ('v1.36.2+rke2r1', 'v1.36.1+rke2r1'),
    ('v1.36.1+rke2r2', 'v1.36.1+rke2r1'),
])
def test_rule5_downgrade(current_rke2, target_rke2):
    assert _rke2_case(current_rke2, target_rke2) == ['RKE2 downgrade is not allowed']


def test_rule5_minor_skip_even_if_the_record_claims_it():
    assert _rke2_case('v1.34.5+rke2r1', 'v1.36.1+rke2r1') == ['RKE2 upgrade cannot skip a Kubernetes minor']


@pytest.mark.parametrize('side,value,reason', [
    ('target', 'v1.36.1-rc1+rke2r1', 'pre-release versions are not allowed'),
    ('target', 'v2.0.1+rke2r1', 'the major version must be 1'),
    ('current', 'v1.35+rke2r1', 'expected v1.MINOR.PATCH+rke2rREV'),
    ('current', 'v1.35.3', 'expected v1.MINOR.PATCH+rke2rREV'),
    ('current', 'v1.35.3+k3s1', 'expected v1.MINOR.PATCH+rke2rREV'),
])
def test_rule5_malformed_versions_are_named(side, value, reason):
    current_rke2, target_rke2 = ('v1.35.3+rke2r3', value) if side == 'target' else (value, 'v1.36.1+rke2r1')
    assert _rke2_case(current_rke2, target_rke2) == ['%s rke2: "%s" is not a valid RKE2 version: %s' % (side, value, reason)]


def test_rule5_other_components_are_not_ordered():
    record = with_target(seed_dict(), kernel='6.8.0-100-generic', driver='535.54.03', gpuOperator='v24.9.0',
                         dcgmExporter='3.3.9-3.6.1-ubuntu22.04')
    target = dict(TARGET, kernel='6.8.0-100-generic', driver='535.54.03', gpu_operator='v24.9.0',
                  dcgm_exporter='3.3.9-3.6.1-ubuntu22.04')
    assert problems_of(record, target=target) == []


# --- rule 6 ---------------------------------------------------------------------------------

def test_rule6_completion_exactly_five_minutes_ahead_passes():
    assert problems_of(now=SEED_COMPLETED_AT - datetime.timedelta(minutes=5)) == []


def test_rule6_completion_more_than_five_minutes_ahead_is_future():
    now = SEED_COMPLETED_AT - datetime.timedelta(minutes=5, microseconds=1)
    assert problems_of(now=now) == ['canary completion time is in the future']


def test_rule6_exactly_the_max_age_passes():
    assert problems_of(now=SEED_COMPLETED_AT + datetime.timedelta(hours=720)) == []
    assert problems_of(now=SEED_COMPLETED_AT + datetime.timedelta(days=7), max_age='7d') == []


def test_rule6_older_than_the_max_age_is_stale():
    now = SEED_COMPLETED_AT + datetime.timedelta(hours=720, microseconds=1)
    assert problems_of(now=now) == ['canary evidence is older than 720h']
    assert problems_of(now=now, max_age='30d') == ['canary evidence is older than 30d']
    assert problems_of(now=SEED_COMPLETED_AT + datetime.timedelta(minutes=91), max_age='90m') == [
        'canary evidence is older than 90m']
    assert problems_of(now=SEED_COMPLETED_AT + datetime.timedelta(seconds=11), max_age='10s') == [
        'canary evidence is older than 10s']


def test_rule6_max_age_in_seconds():
    assert problems_of(now=SEED_COMPLETED_AT + datetime.timedelta(seconds=3601), max_age=3600) == [
        'canary evidence is older than 1h']
    assert problems_of(now=SEED_COMPLETED_AT + datetime.timedelta(seconds=3600), max_age=3600) == []


@pytest.mark.parametrize('value,expected', [
    ('0h', 'max_canary_age "0h" must be positive'),
    ('-1h', 'max_canary_age "-1h" must be positive'),
    ('1.5h', 'max_canary_age "1.5h" is not a duration: use a whole number with unit s, m, h or d, e.g. 720h'),
    ('720', 'max_canary_age "720" is not a duration: use a whole number with unit s, m, h or d, e.g. 720h'),
    ('1w', 'max_canary_age "1w" is not a duration: use a whole number with unit s, m, h or d, e.g. 720h'),
    (0, 'max_canary_age 0 must be positive'),
    (None, 'max_canary_age None is not a duration'),
])
def test_rule6_invalid_max_age_blocks(value, expected):
    assert problems_of(max_age=value) == [expected]


def test_rule6_huge_max_age_does_not_overflow():
    assert problems_of(max_age='99999999999999999999d') == []


# --- rule 7 ---------------------------------------------------------------------------------

@pytest.mark.parametrize('field', ['allocationPassed', 'monitoringPassed', 'rollbackPassed'])
def test_rule7_every_canary_check_must_pass(field):
    assert problems_of(with_canary(seed_dict(), **{field: False})) == ['canary checks must all pass']


def test_rule7_all_failed_is_one_problem():
    record = with_canary(seed_dict(), allocationPassed=False, monitoringPassed=False, rollbackPassed=False)
    assert problems_of(record) == ['canary checks must all pass']


@pytest.mark.parametrize('value', ['', '  '])
def test_rule7_evidence_required(value):
    assert problems_of(with_canary(seed_dict(), evidence=value)) == ['canary evidence is required']


# --- every problem at once --------------------------------------------------------------------

def test_all_problems_are_collected_in_rule_order():
    record = seed_dict(id='Bad_ID', state='draft', approvedBy='', sourceRevision='xyz', hardware=['10de:1db6/10de:124a', 'nope'])
    with_canary(record, rollbackPassed=False, evidence='', completedAt='2026-08-20T00:00:00Z')
    current = dict(TARGET, rke2='v1.38.0+rke2r1')
    target = dict(TARGET, kernel='6.9.0-1-generic')
    result = gate(text(record), pci_ids=['10de:2330/10de:16c1'], current=current, target=target)
    expected = [
        'id "Bad_ID" must be lowercase letters and digits, with "." or "-" only inside',
        'state must be "qualified", got "draft"',
        'approvedBy is required',
        'sourceRevision must be 40 hexadecimal characters, got "xyz"',
        'record PCI id "nope" is malformed: expected vendor:device/subvendor:subdevice in hex, e.g. 10de:1db6/10de:124a',
        'hardware tuple mismatch',
        'kernel target "6.9.0-1-generic" is not the qualified value "6.8.0-135-generic"',
        'RKE2 downgrade is not allowed',
        'canary completion time is in the future',
        'canary checks must all pass',
        'canary evidence is required',
    ]
    assert result.passed is False
    assert result.problems == expected
    assert result.qualification is None
    assert result.msg == 'GPU upgrade blocked: ' + '; '.join(expected)


# --- the record alone (qualification_info) ----------------------------------------------------

def test_validate_record_good():
    record, problems = q.validate_record(SEED_TEXT)
    assert problems == []
    assert record.to_dict() == {
        'apiVersion': 'kube-dc.io/v1alpha1', 'kind': 'GPUUpgradeQualification', 'id': 'v100-kernel-canary-1',
        'state': 'qualified', 'approvedBy': 'platform-review', 'sourceRevision': 'a' * 40,
        'hardware': ['10de:1db6/10de:124a'],
        'target': {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'driver': '580.130.00',
                   'gpuOperator': 'v26.3.4', 'dcgmExporter': '4.4.1-4.6.0-ubuntu22.04'},
        'canary': {'completedAt': '2026-07-14T12:00:00Z', 'allocationPassed': True, 'monitoringPassed': True,
                   'rollbackPassed': True, 'evidence': 'change-record-42'},
    }


def test_validate_record_normalises():
    data = seed_dict(sourceRevision='A' * 40, hardware=[' 10DE:1DB6/10DE:124A '])
    with_canary(data, completedAt='2026-07-14T14:00:00.500+02:00')
    record, problems = q.validate_record(text(data))
    assert problems == []
    normal = record.to_dict()
    assert (normal['sourceRevision'], normal['hardware'], normal['canary']['completedAt']) == (
        'a' * 40, ['10de:1db6/10de:124a'], '2026-07-14T12:00:00.5Z')


def test_validate_record_checks_rules_1_2_and_7_only():
    data = seed_dict(state='draft', hardware=['10de:1db6/10de:124a', '10DE:1DB6/10DE:124A'])
    with_canary(data, monitoringPassed=False, completedAt='2099-01-01T00:00:00Z')  # future is not judged here
    record, problems = q.validate_record(text(data))
    assert record is not None
    assert problems == ['state must be "qualified", got "draft"',
                        'record PCI id "10de:1db6/10de:124a" is listed more than once',
                        'canary checks must all pass']


def test_validate_record_loading_failure():
    assert q.validate_record('kind: [') == (None, [
        "the record is not valid YAML: expected the node content, but found '<stream end>' (line 1, column 8)"])


# --- writing --------------------------------------------------------------------------------

def test_dump_record_round_trips_the_seed():
    record = q.parse_record(SEED_TEXT)
    out = q.dump_record(record)
    assert q.parse_record(out) == record
    assert out.splitlines()[:3] == ['apiVersion: kube-dc.io/v1alpha1', 'kind: GPUUpgradeQualification', 'id: v100-kernel-canary-1']
    assert 'completedAt: 2026-07-14T12:00:00Z' in out.splitlines()[15]


def test_dump_record_from_a_dict_with_a_datetime_and_awkward_strings():
    data = seed_dict(approvedBy='yes', hardware=('10de:1db6/10de:124a',))
    with_target(data, driver='580.13', kernel='09', gpuOperator='null', dcgmExporter='2026-07-14')
    with_canary(data, completedAt=datetime.datetime(2026, 7, 14, 14, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
                evidence='<<')
    record = q.parse_record(q.dump_record(data))
    assert record.approved_by == 'yes'
    assert record.target['driver'] == '580.13' and record.target['kernel'] == '09'
    assert record.target['gpuOperator'] == 'null' and record.target['dcgmExporter'] == '2026-07-14'
    assert record.evidence == '<<'
    assert record.completed_at == SEED_COMPLETED_AT


def test_dump_record_never_writes_anchors():
    shared = ['10de:1db6/10de:124a']
    data = seed_dict(hardware=shared)
    data['canary']['evidence'] = 'x'
    out = q.dump_record(data)
    assert '&' not in out and '*' not in out


def test_dump_record_keeps_field_order_of_an_unordered_dict():
    data = dict(reversed(list(seed_dict().items())))
    assert q.dump_record(data) == q.dump_record(seed_dict())


def test_dump_record_refuses_what_the_parser_refuses():
    with pytest.raises(q.QualificationError) as err:
        q.dump_record(seed_dict(extra='x'))
    assert err.value.problems == ['unknown field "extra"']
    with pytest.raises(q.QualificationError) as err:
        q.dump_record(['x'])
    assert err.value.problems == ['the record must be a mapping, got a list']


def test_dump_record_escapes_characters_yaml_reads_as_line_breaks():
    # Found by the property test: PyYAML writes NEL raw, and reads it back as a line break.
    data = with_canary(with_target(seed_dict(), dcgmExporter='4.4.1\x85'), evidence='a\u2028b\u2029c\ufeffd')
    out = q.dump_record(data)
    record = q.parse_record(out)
    assert record.target['dcgmExporter'] == '4.4.1\x85'
    assert record.evidence == 'a\u2028b\u2029c\ufeffd'


def test_odd_keys_are_quoted_in_messages():
    doc = SEED_TEXT + '"evil\\nkey\\u001b[31m": 1\n"a.b": 2\ncanary2:\n  "x y": &anchor 3\n'
    assert load_problems(doc) == ['YAML anchors are not allowed: "&anchor" at canary2["x y"] (line 24)']
    problems = load_problems(SEED_TEXT + '"evil\\nkey\\u001b[31m": 1\n"a.b": 2\n')
    assert problems == ['unknown field "[\\"evil\\\\nkey\\\\u001b[31m\\"]"', 'unknown field "[\\"a.b\\"]"']
    assert all('\n' not in p and '\x1b' not in p for p in problems)


# --- issue 12 (8): an integer too long for CPython's int/str conversion ------------------------
HUGE = '9' * 5000


def refused_everywhere(doc, shown):
    """The loader, the gate and validate_record all refuse `doc` with the one problem `shown`."""
    assert load_problems(doc) == [shown]
    result = gate(doc)
    assert result.passed is False and result.problems == [shown]
    record, problems = q.validate_record(doc)
    assert record is None and problems == [shown]


@pytest.mark.parametrize('field,replace,shown', [
    ('id', ('id: v100-kernel-canary-1', 'id: ' + HUGE), 'field "id" must be a string, got a number of more than 300 '
     'digits (quote it)'),
    ('canary.allocationPassed', ('allocationPassed: true', 'allocationPassed: ' + HUGE),
     'field "canary.allocationPassed" must be a boolean (true or false), got a number of more than 300 digits'),
    ('target.driver (hex)', ('driver: 580.130.00', 'driver: 0x' + 'f' * 4000),
     'field "target.driver" must be a string, got a number of more than 300 digits (quote it)'),
    ('target.driver (sexagesimal)', ('driver: 580.130.00', 'driver: ' + ':'.join(['59'] * 2500)),
     'field "target.driver" must be a string, got a number of more than 300 digits (quote it)'),
])
def test_an_integer_over_the_digit_limit_is_a_problem_naming_the_field(field, replace, shown):
    doc = SEED_TEXT.replace(*replace)
    assert doc != SEED_TEXT
    refused_everywhere(doc, shown)


def test_an_integer_over_the_digit_limit_in_an_unknown_field_is_reported_too():
    doc = SEED_TEXT + 'extra: ' + HUGE + '\n'
    assert load_problems(doc) == ['unknown field "extra"']


# --- review 2026-12-06 T3-13: a sexagesimal float too large for a float -----------------------
# PyYAML's float constructor multiplies each part by 60 ** n as an int: from about 175 parts the
# product does not fit a float and OverflowError escaped parse_record, validate_record and check_gate.
@pytest.mark.parametrize('parts', [175, 200, 500])
@pytest.mark.parametrize('field,replace,shown', [
    ('canary.evidence', ('evidence: change-record-42', 'evidence: %s0.5'),
     'field "canary.evidence" must be a string, got a number of more than 300 digits (quote it)'),
    ('target.driver', ('driver: 580.130.00', 'driver: %s0.5'),
     'field "target.driver" must be a string, got a number of more than 300 digits (quote it)'),
    ('canary.rollbackPassed', ('rollbackPassed: true', 'rollbackPassed: %s0.5'),
     'field "canary.rollbackPassed" must be a boolean (true or false), got a number of more than 300 digits'),
])
def test_a_sexagesimal_float_too_large_for_a_float_is_a_problem_naming_the_field(parts, field, replace, shown):
    doc = SEED_TEXT.replace(replace[0], replace[1] % ('1:' * parts))
    assert doc != SEED_TEXT
    refused_everywhere(doc, shown)


def test_a_sexagesimal_float_that_fits_a_float_is_still_reported_as_a_number():
    doc = SEED_TEXT.replace('evidence: change-record-42', 'evidence: ' + '1:' * 170 + '0.5')
    (problem,) = load_problems(doc)
    assert problem.startswith('field "canary.evidence" must be a string, got the number ') and problem.endswith('(quote it)')


# --- issue 12 (9): years before 1000 are written with four digits ---------------------------
@pytest.mark.parametrize('moment,text_', [
    (datetime.datetime(999, 12, 31, 23, 59, 59, tzinfo=UTC), '0999-12-31T23:59:59Z'),
    (datetime.datetime(1, 1, 1, 0, 0, 0, 5, tzinfo=UTC), '0001-01-01T00:00:00.000005Z'),
    (datetime.datetime(2026, 7, 14, 12, 0, 0, tzinfo=UTC), '2026-07-14T12:00:00Z'),
])
def test_format_timestamp_pads_the_year(moment, text_):
    assert q.format_timestamp(moment) == text_
    assert q.parse_timestamp(text_) == moment


def test_dump_record_writes_what_parse_record_accepted_for_an_early_year():
    doc = SEED_TEXT.replace('2026-07-14T12:00:00Z', '0999-12-31T23:59:59Z')
    assert doc != SEED_TEXT
    record = q.parse_record(doc)
    again = q.parse_record(q.dump_record(record))
    assert again == record
