"""The README's one-example-per-module block stays true: every option it uses exists in the
module's documentation (as ansible-doc renders it) and every required option is given."""
from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import yaml

README = pathlib.Path(__file__).resolve().parents[2] / 'README.md'


def _examples() -> list[dict]:
    text = README.read_text(encoding='utf-8')
    start = text.index('```yaml\n') + len('```yaml\n')
    return yaml.safe_load(text[start:text.index('```', start)])


def test_every_module_has_a_readme_example() -> None:
    shown = {next(k for k in task if k.startswith('gpufleet.upgrade.')) for task in _examples()}
    modules = {'gpufleet.upgrade.' + p.stem for p in (README.parent / 'plugins' / 'modules').glob('*.py')}
    assert modules - shown == set()


@pytest.mark.parametrize('task', _examples(), ids=lambda t: next(k for k in t if k.startswith('gpufleet')))
def test_readme_example_matches_module_docs(task: dict) -> None:
    module = next(k for k in task if k.startswith('gpufleet.upgrade.'))
    doc = json.loads(subprocess.run(['ansible-doc', '-j', module], check=True, capture_output=True,
                                    text=True).stdout)[module]['doc']
    options = doc.get('options', {})
    names = set(options)
    for opt in options.values():
        names.update(opt.get('aliases', []))
    assert sorted(k for k in task[module] if k not in names) == []
    assert sorted(k for k, o in options.items() if o.get('required') and k not in task[module]) == []
