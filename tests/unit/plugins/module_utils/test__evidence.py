"""Unit tests of the evidence bundle core: merge keys, validation, summary, HTML."""
from __future__ import annotations

import datetime
import hashlib
import html.parser
import json
import pathlib
from typing import Any

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence as ev

T0 = datetime.datetime(2026, 7, 14, 12, 0, tzinfo=datetime.timezone.utc)
BEFORE = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.126.20',
          'gpu_operator': 'v26.3.3', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}
AFTER = dict(BEFORE, kernel='6.8.0-135-generic', driver='580.130.00')


def at(minutes: float) -> str:
    return (T0 + datetime.timedelta(minutes=minutes)).isoformat().replace('+00:00', 'Z')


def sample_bundle() -> dict[str, Any]:
    b = ev.new_bundle('canary-1', now=T0)
    b, _changed = ev.merge(b, {
        'tuple_before': BEFORE, 'tuple_after': AFTER,
        'nodes': [{'name': 'gpu-1', 'role': 'canary', 'uid': 'u-1', 'machine_id': 'm1', 'system_uuid': 's1',
                   'pci_ids': ['10DE:2330/10de:16c1'], 'batch': 0},
                  {'name': 'gpu-2', 'role': 'batch', 'batch': 1}],
        'artifacts': [{'kind': 'driver-package', 'name': 'nvidia-driver-580-server', 'sha256': 'A' * 64},
                      {'kind': 'image', 'name': 'nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04'}],
        'batches': [{'index': 1, 'nodes': ['gpu-2'], 'started': at(60), 'finished': at(90)},
                    {'index': 0, 'kind': 'canary', 'nodes': ['gpu-1'], 'started': at(0), 'finished': at(50)}],
        'actions': [{'name': 'drain', 'node': 'gpu-1', 'batch': 0, 'started': at(1), 'finished': at(5)}],
        'gates': [{'name': 'node', 'kind': 'node', 'node': 'gpu-1', 'batch': 0, 'passed': True,
                   'started': at(10), 'finished': at(12)},
                  {'name': 'metrics', 'kind': 'metric', 'node': 'gpu-1', 'batch': 0, 'passed': True,
                   'started': at(12), 'finished': at(40), 'result': {'problems': []}},
                  {'name': 'rollback', 'kind': 'rollback', 'node': 'gpu-1', 'batch': 0, 'passed': True,
                   'started': at(40), 'finished': at(48)},
                  {'name': 'gpu', 'kind': 'gpu', 'node': 'gpu-2', 'batch': 1, 'passed': False,
                   'started': at(70), 'finished': at(71), 'result': {'problems': ['new Xid 79 on GPU 0']}}],
        'omitted': [{'key': {'pci': '10de:20b5/10de:1533'}, 'nodes': ['gpu-9', 'gpu-10'], 'reason': 'no spare node'}],
    }, now=T0)
    return b


def test_merge_normalises_and_keys_entries() -> None:
    b = sample_bundle()
    assert b['schema'] == ev.SCHEMA and b['id'] == 'canary-1'
    assert b['nodes']['gpu-1']['pci_ids'] == ['10de:2330/10de:16c1']
    assert [x['index'] for x in b['batches']] == [0, 1]
    assert b['artifacts'][0]['sha256'] == 'a' * 64
    g = {x['id']: x for x in b['gates']}
    assert set(g) == {'node@gpu-1#0', 'metrics@gpu-1#0', 'rollback@gpu-1#0', 'gpu@gpu-2#1'}
    assert g['node@gpu-1#0']['category'] == 'allocation'
    assert g['metrics@gpu-1#0']['category'] == 'monitoring'
    assert g['rollback@gpu-1#0']['duration_s'] == 480.0
    assert g['gpu@gpu-2#1']['problems'] == ['new Xid 79 on GPU 0']
    assert b['omitted'][0]['nodes'] == 2 and b['omitted'][0]['blocks'] is True


def test_merge_is_idempotent_and_replaces_by_key() -> None:
    b = sample_bundle()
    same, changed = ev.merge(b, {'gates': [{'name': 'node', 'kind': 'node', 'node': 'gpu-1', 'batch': 0,
                                            'passed': True, 'started': at(10), 'finished': at(12)}]})
    assert changed is False and same == b
    again, changed = ev.merge(b, {'gates': [{'name': 'node', 'kind': 'node', 'node': 'gpu-1', 'batch': 0,
                                             'passed': False, 'started': at(10), 'finished': at(13)}],
                                  'nodes': [{'name': 'gpu-1', 'uid': 'u-1b'}]})
    assert changed is True
    assert len(again['gates']) == 4
    assert next(x for x in again['gates'] if x['id'] == 'node@gpu-1#0')['passed'] is False
    assert again['nodes']['gpu-1']['uid'] == 'u-1b' and again['nodes']['gpu-1']['machine_id'] == 'm1'
    assert b['nodes']['gpu-1']['uid'] == 'u-1'   # the input is not mutated


def test_merge_never_changes_its_input_and_judges_change_on_what_it_touched() -> None:
    """Issue 18: merge no longer deep-copies or serialises the whole bundle; the input stays as it was, whatever
    the update touches, and `changed` is the same as comparing the whole content."""
    b = sample_bundle()
    frozen = json.dumps(b, sort_keys=True)
    updates = [
        {'tuple_after': dict(AFTER, driver='580.130.01')},
        {'nodes': [{'name': 'gpu-3', 'role': 'batch'}]},
        {'nodes': [{'name': 'gpu-1', 'machine_id': 'm1'}]},                      # the same value: no change
        {'artifacts': [{'kind': 'driver-package', 'name': 'nvidia-driver-580-server', 'sha256': 'b' * 64}]},
        {'batches': [{'index': 2, 'nodes': ['gpu-3']}]},
        {'batches': [{'index': 0, 'kind': 'canary', 'nodes': ['gpu-1'], 'started': at(0), 'finished': at(50)}]},
        {'actions': [{'name': 'drain', 'node': 'gpu-1', 'batch': 0, 'started': at(1), 'finished': at(6)}]},
        {'omitted': [{'key': {'pci': '10de:20b5/10de:1533'}, 'nodes': 3, 'reason': 'no spare node'}]},
        {'gates': [], 'nodes': [], 'tuple_before': BEFORE},
    ]
    for update in updates:
        after, changed = ev.merge(b, update, now=T0 + datetime.timedelta(hours=1))
        assert json.dumps(b, sort_keys=True) == frozen, update
        content = [{k: v for k, v in x.items() if k != 'updated'} for x in (b, after)]
        assert changed is (content[0] != content[1]), update
        assert (after['updated'] != b['updated']) is changed
    assert [ev.merge(b, u)[1] for u in updates] == [True, True, False, True, True, False, True, True, False]


@pytest.mark.parametrize('updates,message', [
    ({'gates': [{'name': 'g'}]}, r'gates\[0\] \(g\).passed is required'),
    ({'gates': [{'name': 'g', 'passed': 'maybe'}]}, r"gates\[0\] \(g\).passed: 'maybe' is not a boolean"),
    ({'gates': [{'name': 'g', 'passed': True, 'category': 'vibes'}]}, r"category: 'vibes' is not one of"),
    ({'gates': [{'name': 'g', 'passed': True, 'started': at(5), 'finished': at(1)}]}, r'finished .* is before started'),
    ({'gates': [{'name': 'g', 'passed': True, 'started': '2026-07-14 12:00:00'}]},
     r"started: '2026-07-14 12:00:00' has no UTC offset"),
    # Seconds are required (RFC 3339; Python 3.11's fromisoformat would take it, 3.9's would not).
    ({'gates': [{'name': 'g', 'passed': True, 'started': '2026-07-14T12:00Z'}]},
     r"started: '2026-07-14T12:00Z' is not an RFC 3339 time"),
    ({'gates': [{'name': 'g', 'passed': True, 'colour': 'red'}]}, r'gates\[0\]: unknown field\(s\) colour'),
    ({'nodes': [{'role': 'canary'}]}, r'nodes\[0\].name is required'),
    ({'nodes': [{'name': 'n', 'role': 'pilot'}]}, r"nodes\[0\].role: 'pilot' is not one of"),
    ({'nodes': [{'name': 'n', 'verdict': 'fine'}]}, r"nodes\[0\].verdict: 'fine' is not one of upgraded, failed"),
    ({'nodes': [{'name': 'n', 'phases': 'drain'}]}, r"nodes\[0\].phases: 'drain' is not a list of phase names"),
    ({'nodes': [{'name': 'n', 'started': at(5), 'finished': at(1)}]}, r'nodes\[0\]: finished .* is before started'),
    ({'nodes': [{'name': 'n', 'rolled_back': 'perhaps'}]}, r"nodes\[0\].rolled_back: 'perhaps' is not a boolean"),
    ({'artifacts': [{'kind': 'image', 'name': 'x', 'digest': 'md5:1'}]}, r"digest: 'md5:1' is not sha256:<64 hex>"),
    ({'artifacts': [{'kind': 'driver-package', 'name': 'x', 'sha256': 'abc'}]}, r"sha256: 'abc' is not 64 hex"),
    ({'tuple_after': {'driver': '580', 'cuda': '13'}}, r'tuple_after: unknown key\(s\) cuda'),
    ({'tuple_after': {'driver': ''}}, r"tuple_after.driver: '' must be a non-blank string"),
    ({'batches': [{'nodes': []}]}, r'batches\[0\].index is required'),
    ({'omitted': [{'nodes': 3}]}, r'omitted\[0\].key is required'),
    # Found by test_fuzz_parsers.py (a TypeError before): an option that is not a list of entries.
    ({'nodes': True}, r'nodes: True is not a list of entries'),
    ({'gates': 2.5}, r'gates: 2.5 is not a list of entries'),
    ({'omitted': 'x'}, r"omitted: 'x' is not a list of entries"),
])
def test_merge_rejects_bad_entries(updates: dict[str, Any], message: str) -> None:
    with pytest.raises(ev.EvidenceError, match=message):
        ev.merge(ev.new_bundle('b', now=T0), updates)


def test_artifact_path_is_hashed(tmp_path: pathlib.Path) -> None:
    deb = tmp_path / 'driver.deb'
    deb.write_bytes(b'not really a deb')
    art = {'kind': 'driver-package', 'name': 'd', 'path': str(deb)}
    b, _changed = ev.merge(ev.new_bundle('b', now=T0), {'artifacts': [art]})
    assert b['artifacts'][0]['sha256'] == hashlib.sha256(b'not really a deb').hexdigest()
    with pytest.raises(ev.EvidenceError, match="artifacts: cannot read '/nonexistent.deb'"):
        ev.merge(b, {'artifacts': [{'kind': 'driver-package', 'name': 'd', 'path': '/nonexistent.deb'}]})


def test_new_bundle_id_and_loads() -> None:
    with pytest.raises(ev.EvidenceError, match="id: 'Canary_1' must be lowercase"):
        ev.new_bundle('Canary_1')
    b = sample_bundle()
    assert ev.loads(ev.dumps(b)) == b
    with pytest.raises(ev.EvidenceError, match='not an evidence bundle'):
        ev.loads(json.dumps({'schema': 'other'}))
    with pytest.raises(ev.EvidenceError, match='x.json: not JSON'):
        ev.loads('{', 'x.json')


@pytest.mark.parametrize('key,value,message', [
    ('updated', None, "b.json: updated: None is not an RFC 3339 time"),
    ('created', 1752494400, "b.json: created: 1752494400 is not an RFC 3339 time"),
    ('created', '2026-07-14', "b.json: created: '2026-07-14' is not an RFC 3339 time such as"),
    ('updated', '9999-12-31T23:59:59-01:00', "b.json: updated: '9999-12-31T23:59:59-01:00' is outside the years"),
])
def test_loads_refuses_a_bundle_without_its_created_and_updated_times(key: str, value: Any, message: str) -> None:
    """Found by test_fuzz_parsers.py: a bundle file without `updated` (or with another value) loaded, and the evidence
    module's report (render_html) then raised KeyError when the task changed nothing."""
    doc = json.loads(ev.dumps(sample_bundle()))
    if value is None:
        del doc[key]
    else:
        doc[key] = value
    with pytest.raises(ev.EvidenceError) as exc:
        ev.loads(json.dumps(doc), 'b.json')
    assert str(exc.value).startswith(message)


@pytest.mark.parametrize('edit,message', [
    (lambda d: d['nodes']['gpu-1'].update(duration_s='long'), "b.json: nodes[0].duration_s: 'long' is not a number of seconds"),
    (lambda d: d['nodes']['gpu-1'].update(duration_s=-4), 'b.json: nodes[0].duration_s: -4 is not a number of seconds'),
])
def test_loads_refuses_a_node_duration_that_is_not_seconds(edit: Any, message: str) -> None:
    """Found by test_fuzz_parsers.py: the report formatted a node's stored duration_s with %g (TypeError)."""
    doc = json.loads(ev.dumps(sample_bundle()))
    edit(doc)
    with pytest.raises(ev.EvidenceError) as exc:
        ev.loads(json.dumps(doc), 'b.json')
    assert str(exc.value) == message


def test_loads_gives_the_checked_form_of_nodes_and_artifacts() -> None:
    """Found by test_fuzz_parsers.py: an artifact's version written as a number (the checker takes numbers as text)
    was kept as stored, and summary() and the report concatenated it with a string (TypeError)."""
    b = sample_bundle()
    b, _changed = ev.merge(b, {'nodes': [{'name': 'gpu-1', 'artifacts': [
        {'kind': 'driver-package', 'name': 'nvidia-driver', 'version': '580', 'sha256': 'b' * 64}]}]})
    doc = json.loads(ev.dumps(b))
    doc['artifacts'][0]['version'] = 580
    doc['nodes']['gpu-1']['artifacts'][0]['version'] = 580
    doc['nodes']['gpu-1']['batch'] = '0'
    loaded = ev.loads(json.dumps(doc), 'b.json')
    assert loaded['artifacts'][0]['version'] == '580'
    assert loaded['nodes']['gpu-1']['artifacts'][0]['version'] == '580'
    assert loaded['nodes']['gpu-1']['batch'] == 0
    assert ev.summary(loaded)['tuple_artifacts_without_digest'] == ev.summary(b)['tuple_artifacts_without_digest']
    ev.render_html(loaded)
    # An unedited bundle still reads back as written.
    assert ev.loads(ev.dumps(b)) == b


def test_summary_and_categories() -> None:
    b = sample_bundle()
    s = ev.summary(b)
    assert s['stop'] is True and s['failed_critical'] == ['gpu@gpu-2#1']
    assert s['artifacts_without_digest'] == ['image nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04']
    assert s['omitted_blocking'] == 1
    cats = ev.category_results(b, nodes=['gpu-1'])
    assert cats['allocation']['passed'] and cats['monitoring']['passed'] and cats['rollback']['passed']
    cats = ev.category_results(b)
    assert cats['monitoring']['passed'] is False and cats['monitoring']['failed'] == ['gpu@gpu-2#1']


class _Collect(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(attrs)


def test_html_is_self_contained_with_an_svg_timeline() -> None:
    b = sample_bundle()
    evil = {'name': '<script>alert(1)</script>', 'passed': True, 'node': 'gpu-1', 'batch': 0,
            'started': at(20), 'finished': at(21)}
    b, _changed = ev.merge(b, {'gates': [evil]})
    page = ev.render_html(b)
    p = _Collect()
    p.feed(page)
    assert 'svg' in p.tags and p.tags.count('rect') > 8
    assert 'script' not in p.tags and 'link' not in p.tags and 'img' not in p.tags
    assert not [v for k, v in p.attrs if k in ('src', 'href')]
    assert '&lt;script&gt;alert(1)&lt;/script&gt;' in page
    assert ev.FAIL_COLOR in page and ev.PASS_COLOR in page and ev.BATCH_COLOR in page
    assert 'STOP: 1 critical gate(s) failed' in page
    assert 'missing digest' in page
    assert '{&quot;pci&quot;: &quot;10de:20b5/10de:1533&quot;}' in page


def test_the_timeline_draws_each_stage_with_its_window_and_its_pause() -> None:
    """Issue 16: a batch's observation window (a gate of the batch, no node) and its pause point (an action of the
    batch, no node) are drawn on the batch's own row, with their verdicts."""
    b, _changed = ev.merge(sample_bundle(), {
        'gates': [{'name': 'observation-window', 'kind': 'observation', 'category': 'monitoring', 'batch': 1,
                   'passed': True, 'started': at(91), 'finished': at(95)}],
        'actions': [{'name': 'pause-approval', 'batch': 1, 'started': at(55), 'finished': at(59),
                     'result': {'approved_by': 'alice'}},
                    {'name': 'stop-switch', 'batch': 1, 'ok': False, 'started': at(96)}]})
    svg = ev.timeline_svg(b)
    assert '<title>observation-window: PASS</title>' in svg
    assert '<title>pause-approval ok</title>' in svg and '<title>stop-switch FAILED</title>' in svg
    rows = [line for line in svg.splitlines() if line.startswith('<text x="8"')]
    assert sum('fleet gates' in r for r in rows) == 1      # batch 1's own row: its window, its pause, the stop


def test_html_without_timings_says_so() -> None:
    b, _changed = ev.merge(ev.new_bundle('b', now=T0), {'gates': [{'name': 'g', 'passed': True}]})
    assert 'No timings recorded' in ev.render_html(b)


def test_tuple_artifacts_without_digest() -> None:
    b = sample_bundle()
    # The driver package has a SHA-256 but does not name 580.130.00; the exporter image has no digest.
    assert ev.summary(b)['tuple_artifacts_without_digest'] == [
        'driver 580.130.00', 'gpu_operator v26.3.3', 'dcgm_exporter 4.4.1-4.6.0-ubuntu22.04']
    b, _changed = ev.merge(b, {'artifacts': [
        {'kind': 'driver-package', 'name': 'nvidia-driver-580-server', 'version': '580.130.00-0ubuntu1', 'sha256': 'b' * 64},
        {'kind': 'image', 'name': 'registry.local:5000/nvidia/gpu-operator:v26.3.3', 'digest': 'sha256:' + 'c' * 64},
        {'kind': 'image', 'name': 'nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04',
         'digest': 'sha256:' + 'd' * 64}]})
    assert ev.summary(b)['tuple_artifacts_without_digest'] == []
    assert 'Target tuple without a recorded digest' not in ev.render_html(b)
    img, _changed = ev.merge(ev.new_bundle('x', now=T0), {'tuple_after': AFTER, 'artifacts': [
        {'kind': 'image', 'name': 'nvcr.io/nvidia/driver:580.130.00-ubuntu22.04', 'digest': 'sha256:' + 'e' * 64}]})
    assert ev.summary(img)['tuple_artifacts_without_digest'] == ['gpu_operator v26.3.3',
                                                                 'dcgm_exporter 4.4.1-4.6.0-ubuntu22.04']
    assert 'Target tuple without a recorded digest: gpu_operator v26.3.3' in ev.render_html(img)


def test_node_outcome_is_recorded_with_its_duration_and_shown_in_the_report() -> None:
    b, changed = ev.merge(ev.new_bundle('b', now=T0), {'nodes': [{
        'name': 'gpu-2', 'role': 'batch', 'batch': 1, 'verdict': 'failed', 'phases': ['holders', 'drain'],
        'failed_phase': 'rke2', 'started': at(0), 'finished': at(2), 'rolled_back': 'false', 'message': 'timed out'}]})
    n = b['nodes']['gpu-2']
    assert changed and n['duration_s'] == 120.0 and n['rolled_back'] is False and n['phases'] == ['holders', 'drain']
    assert (n['verdict'], n['failed_phase'], n['message']) == ('failed', 'rke2', 'timed out')
    page = ev.render_html(b)
    assert '<td class="fail">failed</td><td>holders → drain → rke2 FAILED</td><td>120s</td><td>no</td>' in page


def test_measured_flag_belongs_to_the_tuple_after_written_with_it() -> None:
    b, _changed = ev.merge(ev.new_bundle('b', now=T0), {
        'tuple_after': AFTER, 'nodes': [{'name': 'gpu-1', 'role': 'canary', 'tuple_after': AFTER}]}, now=T0)
    assert 'measured' not in b['nodes']['gpu-1']
    measured = dict(AFTER, driver='580.126.20')
    b, changed = ev.merge(b, {'nodes': [{'name': 'gpu-1', 'tuple_after': measured, 'measured': 'yes'}]}, now=T0)
    assert changed and b['nodes']['gpu-1']['measured'] is True and b['nodes']['gpu-1']['tuple_after'] == measured
    # Other fields merge without touching it; the same measurement again changes nothing.
    b, _changed = ev.merge(b, {'nodes': [{'name': 'gpu-1', 'verdict': 'upgraded'}]}, now=T0)
    assert b['nodes']['gpu-1']['measured'] is True
    assert ev.merge(b, {'nodes': [{'name': 'gpu-1', 'tuple_after': measured, 'measured': True}]}, now=T0)[1] is False
    # Nothing could be measured: an empty measured tuple is kept as such.
    b2, _changed = ev.merge(b, {'nodes': [{'name': 'gpu-1', 'tuple_after': {}, 'measured': True}]}, now=T0)
    assert b2['nodes']['gpu-1']['tuple_after'] == {} and b2['nodes']['gpu-1']['measured'] is True
    # Another tuple_after written without the flag (a declared copy), or measured: false, drops it.
    b3, _changed = ev.merge(b, {'nodes': [{'name': 'gpu-1', 'tuple_after': AFTER}]}, now=T0)
    assert 'measured' not in b3['nodes']['gpu-1'] and b3['nodes']['gpu-1']['tuple_after'] == AFTER
    # The value that was measured, written again without the flag (a re-opened bundle), stays a measurement.
    b5, changed = ev.merge(b, {'nodes': [{'name': 'gpu-1', 'tuple_after': measured}]}, now=T0)
    assert changed is False and b5['nodes']['gpu-1']['measured'] is True
    b4, _changed = ev.merge(b, {'nodes': [{'name': 'gpu-1', 'measured': False}]}, now=T0)
    assert 'measured' not in b4['nodes']['gpu-1'] and b4['nodes']['gpu-1']['tuple_after'] == measured


@pytest.mark.parametrize('node,message', [
    ({'name': 'n', 'measured': True}, r'nodes\[0\].measured: true needs tuple_after, the tuple measured on the node'),
    ({'name': 'n', 'measured': 'maybe', 'tuple_after': AFTER}, r"nodes\[0\].measured: 'maybe' is not a boolean"),
    ({'name': 'n', 'measured': True, 'tuple_after': {'driver': ''}},
     r"nodes\[0\].tuple_after.driver: '' must be a non-blank string"),
])
def test_measured_flag_bad_input(node: dict[str, Any], message: str) -> None:
    before = ev.new_bundle('b', now=T0)
    with pytest.raises(ev.EvidenceError, match=message):
        ev.merge(before, {'nodes': [node]})
    assert before['nodes'] == {}
