"""Seeded fuzz of the parsers that read what people edit and what other tools hand over: qualification
records (_qualification), evidence bundles (_evidence.loads and the qualification_record module's pipeline,
the evidence module's merge) and reviewed plans (the rollout's plan filters, the planner's inputs).

Every input must be accepted or refused with the entry point's documented error class (the one its module or
filter turns into a clean failure); anything else would reach a user as a traceback and fails the test. What
is accepted must also survive the next step (a record that loads dumps and loads back the same; a record that
qualification_record writes loads; a bundle that the evidence module merges and writes reads back).

The run is deterministic: GPUFLEET_FUZZ_SEED (default 20261206) seeds it and GPUFLEET_FUZZ_N (default 1000,
about 10 s of CPU) sets how many records it makes, with as many bundles and twice as many plans and planner
inputs (each with a count and a duration value); the records cost most (PyYAML in pure Python). At
GPUFLEET_FUZZ_N=20400 it is at least the 2026-12-06 review's campaign (docs/reliability.md, "the parsers answer
every input"); pytest -s prints the counts. A failure names the target, the exception, where it was raised and the
seed and index to run it again.
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import random
import traceback
import typing as t

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _duration as DU
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _pause as PA
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _plan as P
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _plan_digest as PD
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification_record as qr
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _rollout as RO
from tools.records import CURRENT, NOW, PCI_IDS, SEED_TEXT, TARGET

N = int(os.environ.get('GPUFLEET_FUZZ_N', '1000'))
SEED = int(os.environ.get('GPUFLEET_FUZZ_SEED', '20261206'))
# Failures shown in the assertion message (all are counted).
SHOWN = 8


class Campaign:
    """Counts per target and outcome, and the first input of each crash class (exception type and place)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: t.Dict[str, int] = {}
        self.crashes: t.Dict[str, str] = {}
        self.index = 0

    def count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def crash(self, target: str, what: str, sample: t.Any) -> None:
        self.count(target + ':CRASH')
        if what not in self.crashes:
            shown = sample if isinstance(sample, (str, bytes)) else repr(sample)
            self.crashes[what] = '%s (seed %d, %s input %d): %r' % (what, SEED, self.name, self.index, shown[:300])

    def call(self, target: str, sample: t.Any, refusals: t.Tuple[t.Type[BaseException], ...], fn: t.Callable[..., t.Any],
             /, *args: t.Any, **kwargs: t.Any) -> t.Tuple[bool, t.Any]:
        """fn(*args, **kwargs) accepted (True, its value), refused with one of `refusals` (False, None), or a crash."""
        try:
            value = fn(*args, **kwargs)
        except refusals:
            self.count(target + ':refused')
            return False, None
        except Exception as exc:  # noqa: BLE001 - anything else is what this test looks for
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            self.crash(target, '%s: %s at %s:%d' % (target, type(exc).__name__, os.path.basename(frame.filename),
                                                    frame.lineno), sample)
            return False, None
        self.count(target + ':ok')
        return True, value

    def check(self, target: str, sample: t.Any, condition: bool, what: str) -> None:
        """A property of an accepted input (not an exception): counted as a crash of its own class."""
        if not condition:
            self.crash(target, '%s: %s' % (target, what), sample)

    def assert_clean(self) -> None:
        total = sum(v for k, v in self.counts.items() if k.endswith(':CRASH'))
        assert not self.crashes, '%d crash(es), %d class(es) in the %s fuzz:\n%s' % (
            total, len(self.crashes), self.name, '\n'.join(list(self.crashes.values())[:SHOWN]))


# --------------------------------------------------------------------------------------------
# Odd values

def _odd_scalars() -> t.List[t.Any]:
    """Values of every JSON type and the strings parsers stumble on (no YAML here: for JSON documents)."""
    return [None, True, False, 0, -7, 3.25, 2 ** 80, -(2 ** 70), float('inf'), '', ' ', 'zz', '-', '0', '1e400',
            '\ud83d', '\udcff', '\u2029', '\x85', '\x00', '\ufeff', 'A' * 3000, '9' * 5000, '7' * 5000 + '%',
            'canary', 'batch', 'upgrade_check', 'sha256:' + 'f' * 64, '2026-07-14T12:00:00Z', '2026-13-01T00:00:00Z',
            '0001-01-01T00:00:00+00:30', '9999-12-31T23:59:59-12:00', '10de:2330/10de:16c1', '10DE:2330/10DE:16C1',
            [], {}, [None], [''], ['x'], [0, 0], [[]], {'': None}, {'k': []}, {'name': 'x'}]


def _yaml_scalars() -> t.List[str]:
    """Plain YAML scalars that resolve to something other than a string, or stress the loader."""
    return ['', '~', 'Null', 'NO', 'Off', 'y', 'n', 'TRUE', '+12', '-0', '0o777', '0x_FF', '0b_1', '09', '1__2',
            '12:34:56', '-12:34:56.7', '6.02e23', '-.INF', '.nan', '0.', '2026-07-14t12:00:00.5z',
            '2026-7-4 1:2:3', '2026-07-14', '1' + ':0' * 300 + '.5', ':'.join(['59'] * 400), '1' * 4400,
            '0x' + '9' * 2000, '0b' + '10' * 2000, '-0o' + '7' * 2000, '3' * 500 + '.' + '3' * 500,
            '1e' + '7' * 50, '.' + '0' * 400 + '1', '"\\ud834"', '"\\U0001F4A9"', '"\\0\\a\\e"', '"\\L\\P"',
            "'can''t'", '"unterminated', "'unterminated", '[x, [y, [z]]]', '{k: v, k: w}', '!!binary AAAA',
            '!!timestamp 2026-07-14', '!!int 12', '!!float 1', '!!bool yes', '!!null ""', '!!str 12', '!!set {a}',
            '!!omap [a: 1]', '!!pairs [a: 1]', '!!python/tuple [1]', '!!python/object/new:int [1]', '!local x',
            '!<tag:yaml.org,2002:int> 3', '*nowhere', '&anchor', '? complex', '- item', '| \n  text', '>+\n  text',
            '@at', '`tick', '%percent', '#only-comment', 'x' * 66000, '\u00fc\u00df\u4e16', '\U0001F680',
            '\u202e\u2066', '\x1f', '\x7f', '\x9b']


TIMES = ['2026-07-14T12:00:00Z', '2026-07-14T12:00:00+00:00', '2026-07-14T23:59:59.999999Z', '2026-07-14T12:00:00',
         '2026-02-29T00:00:00Z', '2024-02-29T00:00:00Z', '2026-07-14T24:00:00Z', '2026-07-14T12:00:00+14:00',
         '2026-07-14T12:00:00-25:00', '0001-01-01T00:00:00Z', '0001-01-01T00:30:00+01:00', '9999-12-31T23:59:59Z',
         '9999-12-31T23:00:00-01:00', '10000-01-01T00:00:00Z', '2026-07-14T12:00:00.' + '1' * 3000 + 'Z',
         '2026-07-14 12:00:00Z', '20260714T120000Z', '\u0662\u0660\u0662\u0666-07-14T12:00:00Z']


def mutate_tree(rng: random.Random, node: t.Any, values: t.Sequence[t.Any], depth: int = 0) -> None:
    """One change somewhere inside `node` (a dict or list, changed in place): a value replaced by an odd one,
    a key removed or added, an item copied or removed, or the same one level further down."""
    if isinstance(node, dict) and node:
        key = rng.choice(sorted(node, key=repr))
        roll = rng.random()
        if roll < 0.4 and isinstance(node[key], (dict, list)) and node[key] and depth < 8:
            mutate_tree(rng, node[key], values, depth + 1)
        elif roll < 0.7:
            node[key] = copy.deepcopy(rng.choice(values))
        elif roll < 0.85:
            del node[key]
        else:
            node[rng.choice(['unknown', key.upper() if isinstance(key, str) else 'k', key + ' ' if isinstance(key, str) else 'k',
                             '\udc80', ''])] = copy.deepcopy(rng.choice(values))
    elif isinstance(node, list) and node:
        i = rng.randrange(len(node))
        roll = rng.random()
        if roll < 0.45 and isinstance(node[i], (dict, list)) and node[i] and depth < 8:
            mutate_tree(rng, node[i], values, depth + 1)
        elif roll < 0.65:
            node[i] = copy.deepcopy(rng.choice(values))
        elif roll < 0.85:
            node.insert(rng.randrange(len(node) + 1), copy.deepcopy(node[i]))
        else:
            del node[i]


# --------------------------------------------------------------------------------------------
# Qualification records

# Values a field may well hold (valid or nearly: the other half of the parser's decisions).
PLAUSIBLE = {
    'id': ['h100-canary-2', 'a.b-c', 'x', 'H100', 'id_1', '"quoted-id"'],
    'state': ['qualified', 'draft', 'failed', 'revoked', 'Qualified', '"qualified"'],
    'approvedBy': ['platform-review', '""', 'someone@example.com', "'two words'"],
    'sourceRevision': ['b' * 40, 'B' * 40, 'b' * 39, 'b' * 64, '"%s"' % ('c' * 40)],
    'kernel': ['6.8.0-136-generic', '6.11.0-1-nvidia', '"6.8.0-135-generic"', '6.8'],
    'rke2': ['v1.36.2+rke2r1', 'v1.35.4+rke2r2', 'v2.0.0+rke2r1', 'v1.36.1'],
    'driver': ['580.130.01', '570.172.08', '"580.130.00"', '580'],
    'gpuOperator': ['v26.3.5', 'v25.10.0', '26.3.4'],
    'dcgmExporter': ['4.4.2-4.6.0-ubuntu22.04', '4.4.1-4.6.0-ubuntu24.04'],
    'completedAt': TIMES,
    'allocationPassed': ['true', 'false', 'True', 'yes'],
    'monitoringPassed': ['true', 'false', 'FALSE'],
    'rollbackPassed': ['true', 'false', '"true"'],
    'evidence': ['change-record-43', 'h100-canary-1@' + 'a' * 40, '"https://example.com/e/1"', "''"],
}


def _record_text(rng: random.Random) -> t.Union[str, bytes]:
    """The seed record with one to a few text-level changes, or the seed as data with typed changes dumped in a
    random YAML style."""
    if rng.random() < 0.3:
        data = yaml.safe_load(SEED_TEXT)
        data['canary']['completedAt'] = rng.choice(TIMES)
        odd = _odd_scalars() + [datetime.date(2026, 7, 14), datetime.datetime(2026, 7, 14, 12), b'\x00\xff']
        for _change in range(rng.randint(1, 3)):
            mutate_tree(rng, data, odd)
        try:
            return yaml.dump(data, default_flow_style=rng.choice([None, True, False]), sort_keys=rng.random() < 0.5,
                             allow_unicode=rng.random() < 0.5, default_style=rng.choice([None, '"', "'", '|']))
        except yaml.YAMLError:
            return SEED_TEXT
    text: t.Union[str, bytes] = SEED_TEXT
    for _change in range(rng.choice([1, 1, 1, 2, 2, 3, 5])):
        if isinstance(text, bytes):
            break
        text = _edit_record_text(rng, text)
    return text


def _edit_record_text(rng: random.Random, text: str) -> t.Union[str, bytes]:
    lines = text.split('\n')
    i = rng.randrange(len(lines))
    line = lines[i]
    key, sep, value = line.partition(':')
    kind = rng.randrange(26)
    if kind < 5 and sep:                      # an odd scalar, a timestamp, a tag or an anchor as the value
        choice = rng.random()
        if choice < 0.6:
            value = ' ' + rng.choice(_yaml_scalars())
        elif choice < 0.75:
            value = ' ' + rng.choice(TIMES)
        elif choice < 0.9:
            value = ' ' + rng.choice(['!!str', '!!int', '!!binary', '!!map', '!!seq', '!', '!x', '!!python/name:os.getcwd',
                                      '!<tag:yaml.org,2002:str>', '!!merge']) + value
        else:
            value = ' &v' + value
            lines.append(rng.choice(['copy: *v', 'id: *v', '<<: *v', 'target: *v']))
        lines[i] = key + ':' + value
    elif kind == 5:                           # a line doubled, dropped or moved
        action = rng.randrange(3)
        if action == 0:
            lines.insert(i, line)
        elif action == 1:
            del lines[i]
        else:
            lines.insert(rng.randrange(len(lines) + 1), lines.pop(i))
    elif kind == 6:                           # indentation
        lines[i] = rng.choice(['', ' ', '    ', '\t', ' \t']) + line.lstrip(rng.choice(['', ' ']))
    elif kind == 7:                           # a character inserted anywhere
        pos = rng.randrange(len(line) + 1)
        lines[i] = line[:pos] + rng.choice(['\x00', '\x08', '\t', '\r', '\x85', '\u2028', '\ufeff', '\udfff', '#',
                                            ': ', '- ', '"', "'", '{', ']', '&', '*', '!', '|', '>', '%', '@']) + line[pos:]
    elif kind == 8:                           # document markers and directives
        lines.insert(i, rng.choice(['---', '...', '--- >', '%YAML 1.1', '%YAML 1.3', '%YAML 9.9', '%TAG ! tag:x,1:',
                                    '%FOO bar', '--- !!map', '...\n---\nid: second']))
    elif kind == 9 and sep:                   # nesting, deep or wide
        depth = rng.choice([3, 30, 300, 3000])
        shape = rng.randrange(3)
        if shape == 0:
            value = ' ' + '[' * depth + ']' * depth
        elif shape == 1:
            value = ' ' + '{k: ' * depth + 'v' + '}' * depth
        else:
            value = ' ' + ', '.join(['x'] * depth).join('[]')
        lines[i] = key + ':' + value
    elif kind == 10:                          # aliases that multiply (a small "billion laughs")
        levels = rng.choice([2, 5, 12])
        bomb = ['l0: &l0 [ha, ha, ha, ha, ha, ha, ha, ha]']
        bomb += ['l%d: &l%d [%s]' % (k, k, ', '.join(['*l%d' % (k - 1)] * 8)) for k in range(1, levels)]
        lines[i:i] = bomb
    elif kind == 11:                          # keys of other types, empty, complex
        lines.insert(i, rng.choice(['~: 1', 'yes: 1', '12: x', '0.5: x', "'': x", '? [k]\n: v', '? {k: v}\n: v',
                                    '2026-07-14: x', '<<: [{id: y}]', '"\\udc00": x', 'id : spaced', 'Id: x']))
    elif kind == 12:                          # flow style for the whole document
        try:
            return yaml.dump(yaml.safe_load(text), default_flow_style=True, width=rng.choice([10, 70, 5000]))
        except Exception:  # noqa: BLE001 - a text PyYAML cannot read stays as it is
            return text
    elif kind == 13 and sep:                  # a value right at and around the 64 KiB size limit
        size = len('\n'.join(lines).encode('utf-8', 'surrogatepass')) - len(line.encode('utf-8', 'surrogatepass'))
        room = 65536 - size - len(key) - 2 + rng.choice([-2, -1, 0, 1, 50])
        lines[i] = key + ': ' + 'y' * max(room, 0)
    elif kind == 14 and sep:                  # quoting and block styles of the same value
        v = value.strip()
        lines[i] = key + ': ' + rng.choice(['"%s"' % v, "'%s'" % v, '|-\n    ' + v, '>\n    ' + v, '"%s\\n"' % v,
                                            '!!str "%s"' % v, '"%s' % v, v + ' # note', v + ' #'])
    elif kind == 15:                          # booleans in other spellings
        lines = [ln.replace(': true', ': ' + rng.choice(['True', 'TRUE', 'yes', 'on', 'y', '1', '"true"', '!!bool true']))
                 if rng.random() < 0.6 else ln for ln in lines]
    elif kind == 16:                          # a mapping line turned into a sequence item
        lines[i] = '- ' + line.strip()
    elif kind == 17:                          # duplicated sections
        lines.append(rng.choice(['canary:\n  allocationPassed: false', 'target:\n  driver: 1', 'state: qualified',
                                 'hardware: []', 'hardware:\n  - 10de:1db6/10de:124a']))
    elif kind == 18:                          # another encoding, or invalid UTF-8
        if rng.random() < 0.5:
            return text.encode(rng.choice(['utf-16', 'utf-16-be', 'utf-32-le', 'cp1252', 'utf-8-sig']), errors='replace')
        raw = text.encode('utf-8', 'surrogatepass')
        pos = rng.randrange(len(raw) + 1)
        return raw[:pos] + rng.choice([b'\xfe', b'\xc0\xaf', b'\xe0\x80', b'\xed\xb0\x80', b'\xf8\x88\x80\x80\x80']) + raw[pos:]
    elif kind == 19:                          # cut short
        return '\n'.join(lines)[:rng.randrange(len(text) + 1)]
    elif kind in (20, 21) and sep and value.strip():   # another value a record may well hold
        lines[i] = key + ': ' + rng.choice(PLAUSIBLE.get(key.strip(), [value.strip()]))
    elif kind == 22:                          # comments and blank lines
        lines.insert(i, rng.choice(['', '# reviewed', '   # indented comment', '#', '  ']))
    elif kind == 23:                          # line ends and trailing blanks
        return rng.choice(['\r\n', '\n\n', ' \n']).join(lines)
    elif kind == 24:                          # document markers around a valid body
        return rng.choice(['---\n', '--- # record\n', '%YAML 1.1\n---\n', '']) + '\n'.join(lines) + rng.choice(['', '...\n', '\n# end'])
    else:                                     # wider indentation, consistently
        return '\n'.join(ln.replace('  ', '    ') if ln.startswith('  ') else ln for ln in lines)
    return '\n'.join(lines)


def _gate_args(rng: random.Random) -> t.Tuple[t.Any, t.Any, t.Any, t.Any, t.Any]:
    odd = [None, '', 'x', 7, 2.5, True, [], {}, ['x'], {'k': 1}, '\udcff', 2 ** 4000,
           'v1.36.1+rke2r1', 'v1.36.1', 'v99999999999999999999.0.0+rke2r1', 'v1.36.1+rke2r' + '1' * 4400]
    pci = rng.choice([PCI_IDS, PCI_IDS[0], PCI_IDS * 2, [PCI_IDS[0].upper()], [], None, [None], [3], 'q' * 5000,
                      {'a': 'b'}, ['\udcff'], PCI_IDS[0] + ',' + PCI_IDS[0]])
    current, target = dict(CURRENT), dict(TARGET)
    for tup in (current, target):
        for _change in range(rng.choice([0, 0, 1, 3])):
            tup[rng.choice(sorted(tup) + ['cuda'])] = rng.choice(odd)
    if rng.random() < 0.08:
        current = rng.choice(odd)
    if rng.random() < 0.08:
        target = rng.choice(odd)
    age = rng.choice(['720h', '30d', '1s', '0h', '-5h', '1.5h', 'h', '', ' 720h ', '9' * 30 + 'd', 86400, 0, -1,
                      2 ** 80, 1.5, True, None, [], '1h30m'])
    now = rng.choice([None, NOW, NOW.replace(tzinfo=None), datetime.datetime(1, 1, 2, tzinfo=datetime.timezone.utc),
                      datetime.datetime(9999, 12, 30, tzinfo=datetime.timezone.utc)])
    return pci, current, target, age, now


def fuzz_records(camp: Campaign, rng: random.Random, count: int) -> None:
    for i in range(count):
        camp.index = i
        text = _record_text(rng)
        camp.count('records')
        ok, record = camp.call('parse_record', text, (q.QualificationError,), q.parse_record, text)
        okv, answer = camp.call('validate_record', text, (), q.validate_record, text)
        if okv:
            camp.check('validate_record', text, isinstance(answer[1], list) and all(isinstance(p, str) for p in answer[1])
                       and (answer[0] is None) is (not ok), 'not (record or None, [problem strings]) as parse_record says')
        pci, current, target, age, now = _gate_args(rng)
        okg, gate = camp.call('check_gate', text, (), q.check_gate, text, pci, current, target, age, now)
        if okg:
            camp.call('GateResult.msg', text, (), getattr, gate, 'msg')
            camp.check('check_gate', text, gate.passed is (gate.problems == []) and all(
                isinstance(p, str) and p.strip() for p in gate.problems), 'a verdict that is not PASS or a list of problems')
        if not ok:
            continue
        camp.count('records accepted')
        camp.call('Record.summary', text, (), record.summary)
        okd, dumped = camp.call('dump_record', text, (q.QualificationError,), q.dump_record, record)
        camp.check('dump_record', text, okd, 'an accepted record that dump_record refuses')
        if okd:
            again_ok, again = camp.call('parse_record(dump_record)', dumped, (), q.parse_record, dumped)
            camp.check('round trip', text, not again_ok or again.to_dict() == record.to_dict(),
                       'the dumped record loads as another record')
            camp.call('dumped as UTF-8', dumped, (), dumped.encode, 'utf-8')


# --------------------------------------------------------------------------------------------
# Evidence bundles

REV = '89abcdef0123456789abcdef0123456789abcdef'
T0 = datetime.datetime(2026, 7, 14, 12, 0, tzinfo=datetime.timezone.utc)
AFTER = dict(TARGET)


def _stamp(minutes: int) -> str:
    return ev.rfc3339(T0 + datetime.timedelta(minutes=minutes))


def _qualified_bundle() -> t.Dict[str, t.Any]:
    """A canary bundle that qualification_record turns into a qualified record (every claim proven)."""
    gates = [{'name': 'node', 'kind': 'node', 'node': 'gpu-a', 'batch': 0, 'passed': True, 'finished': _stamp(5)},
             {'name': 'workload', 'kind': 'workload', 'node': 'gpu-a', 'batch': 0, 'passed': True,
              'started': _stamp(6), 'finished': _stamp(16)},
             {'name': 'gpu', 'kind': 'gpu', 'node': 'gpu-b', 'batch': 0, 'passed': True, 'finished': _stamp(20)},
             {'name': 'metrics', 'kind': 'metric', 'batch': 0, 'passed': True, 'finished': _stamp(40)},
             {'name': 'rollback', 'kind': 'rollback', 'node': 'gpu-a', 'batch': 0, 'passed': True, 'finished': _stamp(30)},
             {'name': 'cuda', 'kind': 'cuda', 'node': 'gpu-b', 'batch': 0, 'passed': True, 'finished': _stamp(25)}]
    bundle, _changed = ev.merge(ev.new_bundle('a100-canary-7', now=T0), {
        'tuple_before': dict(AFTER, driver='580.126.20', kernel='6.8.0-134-generic'), 'tuple_after': AFTER,
        'nodes': [{'name': 'gpu-a', 'role': 'canary', 'pci_ids': ['10de:20b5/10de:1533'], 'labels': {'pool': 'a'}},
                  {'name': 'gpu-b', 'pci_ids': ['10de:20b5/10de:1533'], 'started': _stamp(1), 'finished': _stamp(21)},
                  {'name': 'gpu-z', 'role': 'batch', 'pci_ids': ['10de:2330/10de:16c1'], 'batch': 1}],
        'artifacts': [{'kind': 'deb', 'name': 'nvidia-driver-580', 'version': '580.130.00', 'sha256': 'e' * 64}],
        'batches': [{'index': 0, 'kind': 'canary', 'nodes': ['gpu-a', 'gpu-b']}, {'index': 1, 'nodes': ['gpu-z']}],
        'gates': gates,
        'actions': [{'name': 'drain', 'node': 'gpu-a', 'started': _stamp(1), 'finished': _stamp(2)}],
    }, now=T0)
    for name in ('gpu-a', 'gpu-b'):
        bundle, _changed = ev.merge(bundle, {'nodes': qr.canary_measured_nodes(
            name, {'node': name, 'outcome': 'upgraded', 'measured': AFTER})}, now=T0)
    return bundle


# Values an evidence entry may well hold: a bundle edited within its shape (another verdict, node, kind or time).
BUNDLE_VALUES = [True, False, 0, 1, 2, 'gpu-a', 'gpu-b', 'gpu-z', 'canary', 'batch', 'node', 'workload', 'metric',
                 'gpu', 'rollback', 'cuda', 'upgraded', 'failed', _stamp(3), _stamp(600), '2026-07-14T12:30:00+02:00',
                 '10de:20b5/10de:1533', '10de:2330/10de:16c1', ['10de:20b5/10de:1533'], ['gpu-a'], ['gpu-a', 'gpu-z'],
                 '580.130.00', '580.126.20', 'v26.3.4', 'e' * 64, 'sha256:' + 'e' * 64, {}, None]


def _bundle_text(rng: random.Random, base: str) -> str:
    doc = json.loads(base)
    for _change in range(rng.choice([1, 1, 1, 2, 2, 3, 5])):
        values = BUNDLE_VALUES if rng.random() < 0.5 else _odd_scalars()
        part = rng.choice(['nodes', 'gates', 'gates', 'batches', 'artifacts', 'actions', 'tuple', ''])
        # Mostly inside an entry (where people edit), sometimes the bundle's own fields.
        mutate_tree(rng, doc[part] if part and doc.get(part) else doc, values)
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
    if rng.random() < 0.05:
        text = text[:rng.randrange(len(text) + 1)]
    return text


def _update(rng: random.Random) -> t.Dict[str, t.Any]:
    """What an evidence task adds (the module's options that add to the bundle), changed a little."""
    upd: t.Dict[str, t.Any] = {
        'nodes': [{'name': 'gpu-c', 'role': 'batch', 'pci_ids': ['10de:20b5/10de:1533'], 'verdict': 'upgraded',
                   'phases': ['drained', 'installed'], 'started': _stamp(50), 'finished': _stamp(70)}],
        'gates': [{'name': 'node', 'kind': 'node', 'node': 'gpu-c', 'batch': 1, 'passed': True, 'finished': _stamp(71),
                   'result': {'msg': 'ok'}}],
        'batches': [{'index': 1, 'nodes': ['gpu-c']}],
        'actions': [{'name': 'uncordon', 'node': 'gpu-c', 'finished': _stamp(72)}],
        'artifacts': [{'kind': 'image', 'name': 'dcgm-exporter', 'digest': 'sha256:' + 'c' * 64}],
        'omitted': [{'id': 'combo-2', 'reason': 'no canary'}],
        'tuple_after': dict(AFTER)}
    odd = _odd_scalars()
    for _change in range(rng.choice([0, 1, 1, 2])):
        mutate_tree(rng, upd, odd)
    return upd


def _record_module(text: str, revision: t.Any, record_id: t.Any, ref: t.Any) -> t.Tuple[t.Any, ...]:
    """What the qualification_record module runs inside its try (EvidenceError and RecordError are its failures)."""
    bundle = ev.loads(text, 'bundle.json')
    record, reasons = qr.build_record(bundle, revision, record_id, ref)
    return bundle, record, reasons, qr.claim_evidence(bundle)


def _record_content(bundle: t.Dict[str, t.Any], record: t.Dict[str, t.Any], reasons: t.List[str],
                    claims: t.Dict[str, t.Any]) -> str:
    """What the module then writes (outside its try: nothing may raise here)."""
    return qr.dump_yaml(record, reasons, qr.claim_comments(claims, bundle['id']))


def fuzz_bundles(camp: Campaign, rng: random.Random, count: int) -> None:
    base = ev.dumps(_qualified_bundle())
    for i in range(count):
        camp.index = i
        text = _bundle_text(rng, base)
        camp.count('bundles')
        revision = rng.choice([REV, REV.upper(), ' ' + REV, REV[:-1], '', None, 'g' * 40])
        record_id = rng.choice([None, None, 'rec-1', 'Rec', '', '\udcff', 'a' * 300])
        ref = rng.choice([None, None, 'change-9', '', '\u2028x', '# not a comment'])
        ok, built = camp.call('qualification_record', text, (ev.EvidenceError, qr.RecordError), _record_module,
                              text, revision, record_id, ref)
        if ok:
            camp.count('bundles recorded')
            okc, content = camp.call('dump_yaml', text, (), _record_content, *built)
            if okc:
                camp.call('record written', text, (), content.encode, 'utf-8')
                okp, back = camp.call('parse_record(dump_yaml)', text, (), q.parse_record, content)
                camp.check('parse_record(dump_yaml)', text, okp, 'a record qualification_record writes does not load')
                if okp:
                    camp.check('parse_record(dump_yaml)', text, back.to_dict()['state'] == built[1]['state'],
                               'the written record loads with another state')
        # What the evidence module does with the file and a task's entries.
        okl, loaded = camp.call('evidence loads', text, (ev.EvidenceError,), ev.loads, text, 'bundle.json')
        if not okl:
            continue
        # upgrade_check's record of the plan digest, read back by the rollout (plan_digest filter).
        sha = rng.choice(['d' * 64, 'D' * 64, '', None])
        camp.call('plan_digest.verdict', text, (PD.PlanDigestError,), PD.verdict, loaded, sha, 'plan.json')
        upd = _update(rng) if rng.random() < 0.7 else {}
        okm, merged = camp.call('evidence merge', text, (ev.EvidenceError,), ev.merge, loaded, upd, now=T0)
        if not okm:
            continue
        after = merged[0]
        okw, written = camp.call('evidence dumps', text, (), ev.dumps, after)
        camp.call('evidence summary', text, (), ev.summary, after)
        camp.call('evidence report', text, (), ev.render_html, after)
        if okw:
            okr, _back = camp.call('evidence reads its write', written, (ev.EvidenceError,), ev.loads, written, 'bundle.json')
            camp.check('evidence reads its write', written, okr, 'the bundle the evidence module wrote is refused')


# --------------------------------------------------------------------------------------------
# Plans

def _planner_node(name: str, **changes: t.Any) -> t.Dict[str, t.Any]:
    node = {'name': name, 'pci_ids': ['10de:2330/10de:16c1'], 'platform': 'SYS-821GE-TNHR', 'kernel': '6.8.0-134-generic',
            'partition_mode': 'none', 'install_method': 'apt', 'current': dict(CURRENT), 'ready': True,
            'unschedulable': False, 'gpus': 8, 'holders': 0, 'labels': {'zone': 'a'}}
    node.update(changes)
    return node


def _fleet() -> t.List[t.Dict[str, t.Any]]:
    nodes = [_planner_node('gpu-%02d' % i) for i in range(1, 17)]
    nodes += [_planner_node('hgx-%d' % i, pci_ids=['10de:20b5/10de:1533'], platform='AS-4124GO', gpus=4)
              for i in range(1, 7)]
    nodes[3]['unschedulable'] = True
    nodes[20]['current'] = dict(TARGET)
    return nodes


OBSERVATION = {'window': '30m', 'queries': [{'name': 'xid', 'expr': 'sum(DCGM_FI_DEV_XID_ERRORS)', 'limit': 0}],
               'workloads': {'cases': ['matmul'], 'repeat': 2}}


def _reviewed_plan() -> t.Dict[str, t.Any]:
    return P.build_plan(_fleet(), target=TARGET, canaries_per_combination=1, batch_size='25%', max_unavailable='30%',
                        failure_allowance={'gpus': '50%'}, pause_before=[2], observation=OBSERVATION)


PLAN_VALUES = [[1], [2, 2], [0], ['1'], [True], [2 ** 64], '20%', '100%', '101%', '-1', 3, -3, 2 ** 63, 1.0,
               {'window': '1h'}, {'window': 'soon'}, {'window': '1h', 'queries': []}, {'queries': 'up'},
               {'queries': 7}, {'workloads': {'cases': ['a'], 'repeat': 'x'}}, {'workloads': {'cases': 'a'}},
               {'workloads': {'cases': ['a'], 'repeat': [1]}}, {'queries': [{'name': 'q', 'expr': 'up'}]},
               {'nodes': {'resolved': -1}}, {'failure_allowance': []}, {'failure_allowance': {'gpus': 5}},
               [['gpu-01'], []], [['gpu-01', 'gpu-01']], [[None]], [{'a': 1}], [[1]], ['gpu-01']]


def _plan_changed(rng: random.Random, base: str) -> t.Dict[str, t.Any]:
    plan = json.loads(base)
    odd = _odd_scalars() + PLAN_VALUES
    for _change in range(rng.choice([1, 1, 2, 3])):
        if rng.random() < 0.3:
            plan[rng.choice(['batches', 'canaries', 'pauses', 'observation', 'max_unavailable', 'budget', 'digest',
                             'combinations', 'target', 'nodes', 'policy'])] = copy.deepcopy(rng.choice(odd))
        else:
            mutate_tree(rng, plan, odd)
    if rng.random() < 0.5:
        plan['digest'] = P.digest_of(plan)      # an edit whose author recomputed the digest
    return plan


def _pool(rng: random.Random) -> t.List[t.Any]:
    """The pool as fleet_info reads it just before a batch."""
    pool: t.List[t.Any] = [{'name': n['name'], 'ready': rng.random() < 0.95, 'unschedulable': rng.random() < 0.05,
                            'gpus': n['gpus'], 'labels': rng.choice([{}, None, {'gpufleet.io/canary': 'true'}])}
                           for n in _fleet()]
    if rng.random() < 0.25:
        mutate_tree(rng, pool, _odd_scalars())
    return pool


def fuzz_plans(camp: Campaign, rng: random.Random, count: int) -> None:
    reviewed = _reviewed_plan()
    base = json.dumps(reviewed)
    filter_errors = (P.PlanInputError, RO.RolloutError, PD.PlanDigestError)
    for i in range(count):
        camp.index = i
        plan = _plan_changed(rng, base)
        camp.count('plans')
        expected = rng.choice(['', None, reviewed['digest'], plan.get('digest'), 'sha256:' + '0' * 64, 'sha256:x', 5])
        okv, verdict = camp.call('workflow_verdict', plan, (PD.PlanDigestError,), PD.workflow_verdict, plan, expected)
        if okv:
            camp.check('workflow_verdict', plan, isinstance(verdict.get('ok'), bool) and isinstance(verdict.get('msg'), str),
                       'not {ok, msg}')
        camp.call('plan_nodes', plan, (RO.RolloutError,), RO.plan_nodes, plan)
        camp.call('plan_serial', plan, (RO.RolloutError,), RO.plan_serial, plan)
        camp.call('check_plan', plan, (P.PlanInputError,), P.check_plan, plan)
        batches = plan.get('batches')
        count_batches = len(batches) if isinstance(batches, list) else None
        camp.call('check_pauses', plan, (PA.PauseError,), PA.check_pauses, plan.get('pauses'), count_batches)
        camp.call('check_observation', plan, (P.PlanInputError,), P.check_observation, plan.get('observation'))
        window = rng.choice(['15m', '2h', '0s', '', 'later', None, 900])
        gate = rng.choice([None, {}, {'url': 'http://prometheus:9090'}, {'url': 'http://p', 'queries': [{'name': 'xid'}]},
                           {'queries': 3}, 'http://p'])
        camp.call('observation_settings', plan, filter_errors, RO.observation_settings, plan, window, gate)
        camp.call('install_method_verdict', plan, filter_errors, RO.install_method_verdict,
                  plan, rng.choice(['apt', 'operator', 'prebuilt', '', None]))
        camp.call('forks_verdict', plan, filter_errors, RO.forks_verdict, plan.get('batches'), rng.choice([1, 5, 50, 0, '5']))
        batch = rng.choice([(plan.get('batches') or [[]])[0] if isinstance(plan.get('batches'), list) else [],
                            ['gpu-02'], [], ['missing'], [''], 'gpu-02', ['gpu-02', 'gpu-02'], None])
        pool = _pool(rng)
        camp.call('batch_admission', plan, (P.PlanInputError,), P.batch_admission, pool, batch, plan)
        sha = rng.choice(['b' * 64, 'B' * 64, 'b' * 63, '', None])
        recorded = {'gates': [{'kind': 'upgrade_check', 'passed': True, 'inputs': plan.get('digest')}]}
        camp.call('plan_digest.verdict', plan, (PD.PlanDigestError,), PD.verdict, recorded, sha, 'plan.json')


def _planner_args(rng: random.Random) -> t.Dict[str, t.Any]:
    args: t.Dict[str, t.Any] = {
        'nodes': _fleet(), 'target': dict(TARGET), 'canaries_per_combination': 1, 'batch_size': '20%',
        'max_unavailable': 4, 'failure_allowance': {'nodes': '10%'}, 'combination_keys': list(P.DEFAULT_COMBINATION_KEYS),
        'exclude': ['hgx-6'], 'pause_before': [1], 'observation': {'window': '20m'}}
    odd = _odd_scalars() + PLAN_VALUES + ['label:zone', 'label:', 'kernel_flavour', 'gpu-*', '[', 'hgx-?']
    for _change in range(rng.choice([1, 1, 2, 3])):
        name = rng.choice(sorted(args))         # the keyword arguments stay the planner's; their values change
        if rng.random() < 0.3 or not isinstance(args[name], (dict, list)) or not args[name]:
            args[name] = copy.deepcopy(rng.choice(odd))
        else:
            mutate_tree(rng, args[name], odd)
    return args


def fuzz_planner(camp: Campaign, rng: random.Random, count: int) -> None:
    for i in range(count):
        camp.index = i
        args = _planner_args(rng)
        camp.count('planner inputs')
        ok, plan = camp.call('build_plan', args, (P.PlanInputError, P.PlanRefused), P.build_plan, **args)
        if ok:
            camp.call('render_summary', args, (), P.render_summary, plan)
            camp.check('build_plan', args, plan['digest'] == P.digest_of(plan), 'a plan whose digest is not its own')
            okv, verdict = camp.call('workflow_verdict(planned)', args, (PD.PlanDigestError,), PD.workflow_verdict,
                                     json.loads(json.dumps(plan)), plan['digest'])
            camp.check('workflow_verdict(planned)', args, okv and verdict['ok'], 'the planner\'s own plan is refused')
        value = rng.choice(_odd_scalars() + ['25%', '0%', '100%', '100.0%', ' 4', '4 ', '\u0664', '4%%', '%', '+4',
                                             '0x10', '1_0', 2 ** 40, '90s', '1h30m', '1.5h', '-1m', '1e3s', 'P1D',
                                             '9' * 400 + 'h', '1' * 5000 + 's'])
        base = rng.choice([0, 3, 100, 2 ** 50, -4])
        camp.call('resolve_count', value, (P.PlanInputError,), P.resolve_count, value, base, 'batch_size', rng.random() < 0.5)
        camp.call('duration seconds_of', value, (), DU.seconds_of, value)
        camp.call('duration parse_seconds', value, (ValueError,), DU.parse_seconds, value, 'window')
        camp.call('duration parse', value, (ValueError,), DU.parse, value, 'max_canary_age')
        camp.call('pause timeout_seconds', value, (PA.PauseError,), PA.timeout_seconds, value)


# --------------------------------------------------------------------------------------------
# The tests (one campaign each, with a seed of its own: a failure in one does not shift the others)

@pytest.mark.parametrize('name, run, size', [
    ('records', fuzz_records, N),
    ('bundles', fuzz_bundles, N),
    ('plans', fuzz_plans, 2 * N),
    ('planner', fuzz_planner, 2 * N),
])
def test_fuzz_every_input_is_accepted_or_refused_cleanly(name: str, run: t.Callable[..., None], size: int) -> None:
    camp = Campaign(name)
    run(camp, random.Random('%d/%s' % (SEED, name)), size)
    # The campaign's counts (pytest -s shows them): inputs, and per entry point ok, refused and CRASH.
    print('\nfuzz %s, seed %d: %s' % (name, SEED, ', '.join('%s %d' % kv for kv in sorted(camp.counts.items()))))
    camp.assert_clean()
    # The campaign reached both sides of each parser (a generator that only makes garbage tests nothing).
    accepted = {'records': 'parse_record:ok', 'bundles': 'qualification_record:ok', 'plans': 'workflow_verdict:ok',
                'planner': 'build_plan:ok'}[name]
    refused = accepted.replace(':ok', ':refused')
    if size >= 200:
        assert camp.counts.get(accepted, 0) > 0 and camp.counts.get(refused, 0) > 0, camp.counts
