"""Property tests: whatever the fleet and the policy, no batch exceeds either limit, every node to
upgrade appears exactly once, and a refusal always says why."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _plan as P

from .test__plan import CURRENT, TARGET, check_invariants

PCI = ['10de:2330/10de:16c1', '10de:20b5/10de:1533', '10de:26b9/10de:1851']


@st.composite
def fleets(draw):
    count = draw(st.integers(min_value=1, max_value=40))
    nodes = []
    for i in range(count):
        nodes.append({
            'name': 'n%d' % i,
            'pci_ids': [draw(st.sampled_from(PCI))],
            'platform': draw(st.sampled_from(['p1', 'p2'])),
            'kernel': draw(st.sampled_from(['6.8.0-134-generic', '6.11.0-29-generic', '6.8.0-135-generic'])),
            'partition_mode': draw(st.sampled_from(['none', 'mig-1g.10gb'])),
            'install_method': 'apt',
            'current': dict(TARGET) if draw(st.integers(0, 9)) == 0 else dict(CURRENT),
            'ready': draw(st.integers(0, 9)) > 0,
            'unschedulable': draw(st.integers(0, 7)) == 0,
            'gpus': draw(st.sampled_from([0, 1, 4, 8])),
            'holders': draw(st.one_of(st.none(), st.integers(0, 3))),
        })
    return nodes


limits = st.one_of(st.integers(0, 12), st.integers(0, 100).map(lambda p: '%d%%' % p))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=fleets(), batch_size=limits, max_unavailable=limits,
       canaries=st.integers(0, 3), isolated=st.booleans(), omitted_block=st.booleans(),
       fa=st.one_of(st.none(), st.fixed_dictionaries({'gpus': limits}), st.fixed_dictionaries({'nodes': limits})),
       ack=st.booleans())
def test_no_batch_exceeds_either_limit(nodes, batch_size, max_unavailable, canaries, isolated, omitted_block, fa, ack):
    try:
        plan = P.build_plan(nodes, target=TARGET, canaries_per_combination=canaries, batch_size=batch_size,
                            max_unavailable=max_unavailable, failure_allowance=fa, omitted_block=omitted_block,
                            canaries_isolated=isolated, single_node_pool_acknowledged=ack)
    except P.PlanRefused as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        assert exc.plan['batches'] == []
        return
    check_invariants(plan, nodes)
    to_upgrade = {n['name'] for n in nodes if n['current'] != TARGET}
    assert {x for b in plan['batches'] for x in b} == to_upgrade
    assert sum(len(b) for b in plan['batches']) == len(to_upgrade)
    if omitted_block:
        assert plan['omitted'] == []
    for c in plan['combinations']:
        assert c['canaries'] or c['id'] in {o['id'] for o in plan['omitted']}
        assert len(c['canaries']) <= max(canaries, 0)
    assert plan['digest'] == P.digest_of(plan)
