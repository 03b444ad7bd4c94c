# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Used by the metric_gate module.
"""Metric gate: Prometheus queries over an observation window against a written reference.

Each declared query is evaluated as a range query over the observation window and reduced per
series (mean, max, min or last of the valid points). Its value is compared with exactly one
reference:

* ``baseline``: the same query (or a declared ``expr``) over an earlier window of the same length
  (``offset``) or an explicit ``start``/``end``; series are matched by their full label set;
* ``control``: a query over control nodes still on the previous tuple, over the same window (it
  tells a driver effect from a traffic change); each side must reduce to one series;
* ``limit``: a written absolute value (the DCGM presets use it).

A query passes only when every one of these holds: every series has at least ``min_samples``
valid points (a point is valid when it is finite), the reference has them too, the traffic count
(``count_expr``, an instant query at the window end) is at least ``min_count``, and the value is
within the tolerance in the regressing direction. A query that returns no series fails: lost
telemetry must not look quiet. The verdict is conjunctive: one failed critical query fails it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import socket
from typing import Any, Callable, Dict, List, Optional, Tuple

from urllib.error import URLError
from urllib.parse import urlencode

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _duration
from ansible_collections.gpufleet.upgrade.plugins.module_utils._kube_time import parse_time as rfc3339_time
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import DNS_SUBDOMAIN, redact_urls, text_field

COMPARES = ('baseline', 'control', 'limit')
DIRECTIONS = ('higher_is_worse', 'lower_is_worse', 'any')
REDUCERS = ('mean', 'max', 'min', 'last')
PRESETS = ('xid', 'ecc', 'row_remap', 'temperature')
MAX_POINTS = 11000  # Prometheus refuses range queries with more points per series.

# dcgm-exporter metric names (NVIDIA/dcgm-exporter etc/default-counters.csv). The ECC counters
# are off by default in that file: enable them, since a missing series fails the gate.
DCGM_XID = 'DCGM_FI_DEV_XID_ERRORS'
DCGM_ECC_DBE_VOL = 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL'
DCGM_ROW_REMAP_FAILURE = 'DCGM_FI_DEV_ROW_REMAP_FAILURE'
DCGM_GPU_TEMP = 'DCGM_FI_DEV_GPU_TEMP'

_LABEL_NAME = re.compile(r'^[a-zA-Z_][a-zA-Z0-9_]*$')


class MetricGateError(ValueError):
    """Bad input: the message names the field and the value."""


class PrometheusError(RuntimeError):
    """The Prometheus HTTP API could not answer (network, timeout, bad query)."""


# --------------------------------------------------------------------------------------------
# Input parsing
# --------------------------------------------------------------------------------------------

def parse_duration(value: Any, field: str) -> float:
    """'90s', '15m', '24h', '7d', '1h30m' -> seconds (> 0): the grammar of _duration."""
    try:
        return _duration.parse_seconds(value, field)
    except ValueError as exc:
        raise MetricGateError(str(exc))


def parse_time(value: Any, field: str) -> float:
    """RFC 3339 with an offset (or Z), or unix seconds -> unix seconds."""
    if isinstance(value, bool):
        raise MetricGateError('%s: %r is not a time' % (field, value))
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise MetricGateError('%s: %r has no UTC offset' % (field, value))
        return value.timestamp()
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return rfc3339_time(text, field).timestamp()
    except ValueError as exc:
        raise MetricGateError('%s (or unix seconds)' % exc) from None


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).isoformat().replace('+00:00', 'Z')


def _number(value: Any, field: str, minimum: Optional[float] = None) -> float:
    if isinstance(value, bool):
        raise MetricGateError('%s: %r is not a number' % (field, value))
    try:
        num = float(value)
    except (TypeError, ValueError):
        raise MetricGateError('%s: %r is not a number' % (field, value))
    if not math.isfinite(num):
        raise MetricGateError('%s: %r must be finite' % (field, value))
    if minimum is not None and num < minimum:
        raise MetricGateError('%s: %r must be at least %s' % (field, value, _fmt(minimum)))
    return num


@dataclasses.dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start

    def as_dict(self) -> Dict[str, Any]:
        return {'start': iso(self.start), 'end': iso(self.end), 'seconds': round(self.length, 3)}


def resolve_window(window: Optional[str], start: Any, end: Any, now: float) -> Window:
    """The observation window from `window` (a duration) and/or `window_start`/`window_end`."""
    end_ts = parse_time(end, 'window_end') if end not in (None, '') else now
    if start not in (None, ''):
        if window not in (None, ''):
            raise MetricGateError('window and window_start are mutually exclusive: give one')
        start_ts = parse_time(start, 'window_start')
    elif window not in (None, ''):
        start_ts = end_ts - parse_duration(window, 'window')
    else:
        raise MetricGateError('window: give a duration (e.g. 24h) or window_start')
    if start_ts >= end_ts:
        raise MetricGateError('window: start %s is not before end %s' % (iso(start_ts), iso(end_ts)))
    if end_ts > now + 300:
        raise MetricGateError('window_end: %s is in the future' % iso(end_ts))
    return Window(start_ts, end_ts)


def resolve_step(step: Any, window: Window) -> float:
    if step in (None, '', 'auto'):
        return float(max(1, int(window.length // 250)))
    seconds = parse_duration(step, 'step')
    if window.length / seconds > MAX_POINTS:
        raise MetricGateError('step: %r gives more than %d points over the %ss window; raise it'
                              % (step, MAX_POINTS, _fmt(window.length)))
    return seconds


@dataclasses.dataclass(frozen=True)
class QuerySpec:
    """One declared query, validated."""

    name: str
    expr: str
    compare: str
    reference_expr: Optional[str] = None
    reference_window: Optional[Window] = None
    limit: Optional[float] = None
    tol_abs: float = 0.0
    tol_rel: float = 0.0
    direction: str = 'higher_is_worse'
    reduce: str = 'mean'
    min_samples: int = 1
    count_expr: Optional[str] = None
    min_count: Optional[float] = None
    critical: bool = True
    preset: Optional[str] = None
    # (label, names): every name must have an observed series whose `label` equals it (the presets over `nodes`).
    expect_label: Optional[Tuple[str, Tuple[str, ...]]] = None

    def allowed(self, reference: float) -> float:
        """The written tolerance: the larger of `abs` and `rel` x |reference|."""
        return max(self.tol_abs, self.tol_rel * abs(reference))

    def bounds(self, reference: float) -> Tuple[Optional[float], Optional[float]]:
        d = self.allowed(reference)
        low = None if self.direction == 'higher_is_worse' else reference - d
        high = None if self.direction == 'lower_is_worse' else reference + d
        return low, high


WINDOW_PLACEHOLDER = '$window'


def with_window(expr: str, window: Window) -> str:
    """Replace ``$window`` with the window length in whole seconds (``86400s``), for range selectors
    such as ``increase(requests_total[$window])`` that must cover exactly the observation window."""
    return expr.replace(WINDOW_PLACEHOLDER, '%ds' % max(1, int(round(window.length))))


def _str_field(raw: Dict[str, Any], key: str, where: str, required: bool = True) -> Optional[str]:
    return text_field(raw, key, where, required, MetricGateError)


def parse_query(raw: Any, index: int, window: Window, default_min_samples: int) -> QuerySpec:
    where = 'queries[%d]' % index
    if not isinstance(raw, dict):
        raise MetricGateError('%s: %r is not a dict' % (where, raw))
    known = {'name', 'expr', 'baseline', 'control', 'limit', 'tolerance', 'direction', 'reduce',
             'min_samples', 'count_expr', 'min_count', 'critical'}
    unknown = sorted(k for k in raw if k not in known and raw[k] is not None)
    if unknown:
        raise MetricGateError('%s: unknown field(s) %s' % (where, ', '.join(unknown)))
    name = _str_field(raw, 'name', where)
    where = 'queries[%d] (%s)' % (index, name)
    expr = _str_field(raw, 'expr', where)
    given = [k for k in COMPARES if raw.get(k) is not None]
    if len(given) != 1:
        raise MetricGateError('%s: give exactly one of baseline, control or limit (got %s)'
                              % (where, ', '.join(given) or 'none'))
    compare = given[0]
    kw = {'name': name, 'expr': with_window(expr, window), 'compare': compare}  # type: Dict[str, Any]
    if compare == 'baseline':
        b = raw['baseline']
        if not isinstance(b, dict):
            raise MetricGateError('%s.baseline: %r is not a dict' % (where, b))
        extra = sorted(k for k in b if k not in ('offset', 'start', 'end', 'expr') and b[k] is not None)
        if extra:
            raise MetricGateError('%s.baseline: unknown field(s) %s' % (where, ', '.join(extra)))
        kw['reference_expr'] = with_window(_str_field(b, 'expr', where + '.baseline', required=False) or expr, window)
        has_offset = b.get('offset') not in (None, '')
        has_range = b.get('start') not in (None, '') or b.get('end') not in (None, '')
        if has_offset == has_range:
            raise MetricGateError('%s.baseline: give either offset, or start and end' % where)
        if has_offset:
            off = parse_duration(b['offset'], where + '.baseline.offset')
            if off < window.length:
                raise MetricGateError('%s.baseline.offset: %r is shorter than the %ss window: the baseline would '
                                      'overlap the observation' % (where, b['offset'], _fmt(window.length)))
            kw['reference_window'] = Window(window.start - off, window.end - off)
        else:
            if b.get('start') in (None, '') or b.get('end') in (None, ''):
                raise MetricGateError('%s.baseline: start and end are both required' % where)
            ref = Window(parse_time(b['start'], where + '.baseline.start'), parse_time(b['end'], where + '.baseline.end'))
            if ref.start >= ref.end:
                raise MetricGateError('%s.baseline: start is not before end' % where)
            if ref.end > window.start:
                raise MetricGateError('%s.baseline: ends at %s, after the observation window starts (%s)'
                                      % (where, iso(ref.end), iso(window.start)))
            kw['reference_window'] = ref
    elif compare == 'control':
        c = raw['control']
        if not isinstance(c, dict):
            raise MetricGateError('%s.control: %r is not a dict' % (where, c))
        extra = sorted(k for k in c if k != 'expr' and c[k] is not None)
        if extra:
            raise MetricGateError('%s.control: unknown field(s) %s' % (where, ', '.join(extra)))
        kw['reference_expr'] = with_window(_str_field(c, 'expr', where + '.control'), window)
        kw['reference_window'] = window
    else:
        kw['limit'] = _number(raw['limit'], where + '.limit')
    tol = raw.get('tolerance') or {}
    if not isinstance(tol, dict):
        raise MetricGateError('%s.tolerance: %r is not a dict' % (where, tol))
    extra = sorted(k for k in tol if k not in ('abs', 'rel') and tol[k] is not None)
    if extra:
        raise MetricGateError('%s.tolerance: unknown field(s) %s' % (where, ', '.join(extra)))
    kw['tol_abs'] = _number(tol.get('abs') or 0, where + '.tolerance.abs', 0)
    kw['tol_rel'] = _number(tol.get('rel') or 0, where + '.tolerance.rel', 0)
    direction = raw.get('direction') or 'higher_is_worse'
    if direction not in DIRECTIONS:
        raise MetricGateError('%s.direction: %r is not one of %s' % (where, direction, ', '.join(DIRECTIONS)))
    kw['direction'] = direction
    reduce = raw.get('reduce') or 'mean'
    if reduce not in REDUCERS:
        raise MetricGateError('%s.reduce: %r is not one of %s' % (where, reduce, ', '.join(REDUCERS)))
    kw['reduce'] = reduce
    ms = raw.get('min_samples')
    ms = default_min_samples if ms is None else ms
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 1:
        raise MetricGateError('%s.min_samples: %r must be an integer of at least 1' % (where, ms))
    kw['min_samples'] = ms
    count_expr = _str_field(raw, 'count_expr', where, required=False)
    kw['count_expr'] = with_window(count_expr, window) if count_expr else None
    if raw.get('min_count') is not None:
        kw['min_count'] = _number(raw['min_count'], where + '.min_count', 0)
    if (kw['count_expr'] is None) != (kw.get('min_count') is None):
        raise MetricGateError('%s: count_expr and min_count go together (the minimum traffic in the window)' % where)
    crit = raw.get('critical')
    if crit is not None and not isinstance(crit, bool):
        raise MetricGateError('%s.critical: %r is not a boolean' % (where, crit))
    kw['critical'] = True if crit is None else crit
    return QuerySpec(**kw)


def _label_value(value: str) -> str:
    return value.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def parse_nodes(nodes: Any, field: str = 'nodes') -> List[str]:
    """Kubernetes node names (DNS-1123 subdomains), in their order, without repeats; at least one."""
    if not isinstance(nodes, (list, tuple)):
        raise MetricGateError('%s: %r is not a list of node names' % (field, nodes))
    if not nodes:
        raise MetricGateError('%s: give at least one node name' % field)
    out = []  # type: List[str]
    for index, name in enumerate(nodes):
        if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
            raise MetricGateError("%s[%d]: %r is not a Kubernetes node name (a DNS-1123 subdomain: lowercase "
                                  "alphanumerics, '-' and '.', at most 253 characters)" % (field, index, name))
        if name not in out:
            out.append(name)
    return out


def nodes_regex(nodes: List[str]) -> str:
    """The RE2 alternation matching exactly these (validated) node names: '.' escaped. Prometheus anchors
    label matchers, so `a|b` matches `a` or `b` and nothing else."""
    return '|'.join(n.replace('.', '\\.') for n in nodes)


def preset_queries(presets: List[str], node: Optional[str], node_label: str, temperature_max: float,
                   min_samples: int, nodes: Optional[List[str]] = None) -> List[QuerySpec]:
    """DCGM presets over dcgm-exporter series of one node, each a critical `limit` query.

    With `nodes` (instead of `node`), one query per preset selects the series of all these nodes, and
    every node must have at least one series in the observation window (`expect_label`)."""
    if nodes is not None:
        if node:
            raise MetricGateError('node and nodes are mutually exclusive: give one')
        nodes = parse_nodes(nodes)
    if not presets:
        return []
    bad = [p for p in presets if p not in PRESETS]
    if bad:
        raise MetricGateError('presets: %s not one of %s' % (', '.join(repr(b) for b in bad), ', '.join(PRESETS)))
    if not node and not nodes:
        raise MetricGateError('node is required with presets (the value of %s on the node\'s DCGM series)' % node_label)
    if not _LABEL_NAME.match(node_label or ''):
        raise MetricGateError('node_label: %r is not a Prometheus label name' % (node_label,))
    expect = None  # type: Optional[Tuple[str, Tuple[str, ...]]]
    if nodes:
        # The PromQL string literal holds the RE2 regex: its backslashes are escaped once more.
        sel = '{%s=~"%s"}' % (node_label, _label_value(nodes_regex(nodes)))
        expect = (node_label, tuple(nodes))
    else:
        sel = '{%s="%s"}' % (node_label, _label_value(node or ''))
    table = {
        # Last Xid seen since the exporter (re)started; any non-zero value is a new Xid.
        'xid': ('dcgm_xid', DCGM_XID + sel, 0.0),
        # Volatile double-bit (uncorrectable) ECC errors since the driver loaded: must stay 0.
        'ecc': ('dcgm_ecc_uncorrected', DCGM_ECC_DBE_VOL + sel, 0.0),
        # Row-remapping failure flag (Ampere and later): must stay 0.
        'row_remap': ('dcgm_row_remap_failure', DCGM_ROW_REMAP_FAILURE + sel, 0.0),
        'temperature': ('dcgm_gpu_temperature', DCGM_GPU_TEMP + sel, temperature_max),
    }
    out = []
    for p in presets:
        name, expr, limit = table[p]
        out.append(QuerySpec(name=name, expr=expr, compare='limit', limit=limit, direction='higher_is_worse',
                             reduce='max', min_samples=min_samples, critical=True, preset=p, expect_label=expect))
    return out


# --------------------------------------------------------------------------------------------
# Prometheus HTTP API
# --------------------------------------------------------------------------------------------

# opener(url, headers, timeout) -> (HTTP status, body). The module passes one built on
# ansible.module_utils.urls.open_url (TLS options, _http.http_get); it returns HTTP errors as their status, and
# raises _http.RedirectRefused (a URLError) for a redirect to another origin, which must not get the headers.
Opener = Callable[[str, Dict[str, str], float], Tuple[int, bytes]]


class PrometheusClient:
    """Read-only client for /api/v1/query and /api/v1/query_range with a bounded timeout."""

    def __init__(self, base_url: str, opener: Opener, timeout: float = 10.0,
                 headers: Optional[Dict[str, str]] = None) -> None:
        if not re.match(r'^https?://[^/\s]+', base_url or ''):
            raise MetricGateError('url: %r is not an http(s) URL' % (redact_urls(base_url),))
        if re.match(r'^https?://[^/?#]*@', base_url, re.I):
            # Module options' values are in the task result's invocation: credentials come from no_log options.
            raise MetricGateError('url: %r has credentials in it; give them as url_username and url_password, or '
                                  'a token as bearer_token' % (redact_urls(base_url),))
        if not 0 < timeout <= 300:
            raise MetricGateError('timeout: %r must be between 1 and 300 seconds' % (timeout,))
        self.base_url = base_url.rstrip('/')
        self.shown_url = redact_urls(self.base_url)   # what messages name: never its credentials
        self.timeout = float(timeout)
        self.headers = dict(headers or {})
        self.headers.setdefault('Accept', 'application/json')
        self.opener = opener
        self.requests = 0

    def _get(self, path: str, params: Dict[str, Any]) -> Dict[str, Any]:
        url = '%s%s?%s' % (self.base_url, path, urlencode(params))
        self.requests += 1
        try:
            status, body = self.opener(url, self.headers, self.timeout)
        except (socket.timeout, TimeoutError):
            raise PrometheusError('Prometheus at %s did not answer within %ss' % (self.shown_url, _fmt(self.timeout)))
        except URLError as exc:
            reason = getattr(exc, 'reason', exc)
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise PrometheusError('Prometheus at %s did not answer within %ss' % (self.shown_url, _fmt(self.timeout)))
            if getattr(exc, 'redirect_target', None):   # _http.RedirectRefused: the token stays with this origin
                raise PrometheusError('Prometheus at %s %s' % (self.shown_url, redact_urls(reason)))
            raise PrometheusError('cannot reach Prometheus at %s: %s' % (self.shown_url, redact_urls(reason)))
        except (OSError, ValueError) as exc:
            raise PrometheusError('cannot reach Prometheus at %s: %s' % (self.shown_url, redact_urls(exc)))
        try:
            doc = json.loads(body.decode('utf-8')) if body else {}
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        if status != 200 or doc.get('status') != 'success':
            detail = doc.get('error') or (body[:200].decode('utf-8', 'replace') if body else '')
            raise PrometheusError('Prometheus %s answered HTTP %s for %r: %s%s' % (
                path, status, params.get('query'), doc.get('errorType', '') and doc['errorType'] + ': ', detail))
        data = doc.get('data')
        if not isinstance(data, dict):
            raise PrometheusError('Prometheus %s answered without data for %r' % (path, params.get('query')))
        if doc.get('warnings'):
            data = dict(data)
            data['warnings'] = list(doc['warnings'])
        return data

    def query_range(self, expr: str, window: Window, step: float) -> Tuple[List[Dict[str, Any]], List[str]]:
        data = self._get('/api/v1/query_range', {
            'query': expr, 'start': '%.3f' % window.start, 'end': '%.3f' % window.end, 'step': '%g' % step,
            'timeout': '%ds' % max(1, int(self.timeout))})
        if data.get('resultType') != 'matrix':
            raise PrometheusError('query_range for %r returned %r, not a matrix' % (expr, data.get('resultType')))
        return list(data.get('result') or []), list(data.get('warnings') or [])

    def query(self, expr: str, at: float) -> Tuple[List[Dict[str, Any]], List[str]]:
        data = self._get('/api/v1/query', {'query': expr, 'time': '%.3f' % at,
                                           'timeout': '%ds' % max(1, int(self.timeout))})
        rtype = data.get('resultType')
        result = data.get('result')
        if rtype == 'scalar':
            result = [{'metric': {}, 'value': result}]
        elif rtype != 'vector':
            raise PrometheusError('query for %r returned %r, not a vector or scalar' % (expr, rtype))
        return list(result or []), list(data.get('warnings') or [])


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------

def _fmt(value: Optional[float]) -> str:
    if value is None:
        return 'none'
    return '%.6g' % value


def _labels_text(labels: Dict[str, str]) -> str:
    return '{' + ', '.join('%s="%s"' % (k, labels[k]) for k in sorted(labels)) + '}'


def _key(labels: Dict[str, str]) -> Tuple[Tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items()))


def _to_float(raw: Any) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        return float('nan')


def reduce_series(result: List[Dict[str, Any]], how: str) -> List[Dict[str, Any]]:
    """Matrix -> [{labels, value, samples, invalid_points, first, last}] (value None with no valid point)."""
    out = []
    for item in result:
        labels = dict(item.get('metric') or {})
        points = [(float(t), _to_float(v)) for t, v in (item.get('values') or [])]
        valid = [(t, v) for t, v in points if math.isfinite(v)]
        vals = [v for _t, v in valid]
        value = None  # type: Optional[float]
        if vals:
            if how == 'max':
                value = max(vals)
            elif how == 'min':
                value = min(vals)
            elif how == 'last':
                value = vals[-1]
            else:
                value = math.fsum(vals) / len(vals)
        out.append({'labels': labels, 'value': value, 'samples': len(vals),
                    'invalid_points': len(points) - len(vals),
                    'first': iso(valid[0][0]) if valid else None, 'last': iso(valid[-1][0]) if valid else None})
    out.sort(key=lambda s: _key(s['labels']))
    return out


def _compare(spec: QuerySpec, obs: float, ref: float, ref_word: str, where: str) -> Optional[str]:
    low, high = spec.bounds(ref)
    eps = 1e-9 * max(1.0, abs(ref))
    tol = spec.allowed(ref)
    if high is not None and obs > high + eps:
        return '%s: %s is above the allowed %s (%s %s + tolerance %s)%s' % (
            spec.name, _fmt(obs), _fmt(high), ref_word, _fmt(ref), _fmt(tol), where)
    if low is not None and obs < low - eps:
        return '%s: %s is below the allowed %s (%s %s - tolerance %s)%s' % (
            spec.name, _fmt(obs), _fmt(low), ref_word, _fmt(ref), _fmt(tol), where)
    return None


def attribute_problems(problems: List[str], tied: Dict[int, Dict[str, str]], label: str,
                       nodes: Tuple[str, ...]) -> Dict[str, List[str]]:
    """{node: [problems]}: a problem about a series goes to the node its `label` names; one about no series,
    or about a series of no listed node, goes to every node (nothing clears them)."""
    out = {n: [] for n in nodes}  # type: Dict[str, List[str]]
    for index, problem in enumerate(problems):
        owner = tied.get(index, {}).get(label)
        for n in ([owner] if owner in out else nodes):
            out[n].append(problem)
    return out


def evaluate_query(client: PrometheusClient, spec: QuerySpec, window: Window, step: float,
                   attribute: Optional[Tuple[str, Tuple[str, ...]]] = None) -> Dict[str, Any]:
    """Evidence and verdict of one query. Prometheus errors become problems of this query.

    With `spec.expect_label` (label, names), every name needs an observed series whose label equals it.
    With it or `attribute` (label, nodes), the evidence has `by_node`, the problems of each node."""
    problems = []  # type: List[str]
    tied = {}  # type: Dict[int, Dict[str, str]]  # index in problems -> labels of the series it is about
    ev = {
        'name': spec.name, 'preset': spec.preset, 'critical': spec.critical, 'compare': spec.compare,
        'direction': spec.direction, 'reduce': spec.reduce, 'min_samples': spec.min_samples,
        'tolerance': {'abs': spec.tol_abs, 'rel': spec.tol_rel},
        'observed': {'expr': spec.expr, 'window': window.as_dict(), 'series': [], 'value': None},
        'reference': None, 'count': None, 'allowed': None, 'warnings': [],
    }  # type: Dict[str, Any]
    observed = []  # type: List[Dict[str, Any]]
    try:
        raw, warns = client.query_range(spec.expr, window, step)
        ev['warnings'].extend(warns)
        observed = reduce_series(raw, spec.reduce)
    except PrometheusError as exc:
        problems.append('%s: %s' % (spec.name, exc))
        raw = None
    ev['observed']['series'] = observed
    if raw is not None and not observed:
        problems.append('%s: no series for %s in the observation window (missing telemetry is a failure)'
                        % (spec.name, spec.expr))
    for s in observed:
        if s['samples'] < spec.min_samples:
            tied[len(problems)] = s['labels']
            problems.append('%s: %d valid sample(s) for %s in the observation window, at least %d required'
                            % (spec.name, s['samples'], _labels_text(s['labels']), spec.min_samples))
    if spec.expect_label is not None and raw is not None:
        label, names = spec.expect_label
        seen = {s['labels'].get(label) for s in observed}
        for name in names:
            if name not in seen:
                tied[len(problems)] = {label: name}
                problems.append('%s: no series of node %s in the observation window (its monitoring is lost: a failure)'
                                % (spec.name, name))

    # Reference.
    reference = []  # type: List[Dict[str, Any]]
    if spec.compare == 'limit':
        ev['reference'] = {'kind': 'limit', 'value': spec.limit}
    else:
        if spec.reference_window is None or spec.reference_expr is None:  # parse_query always sets both
            raise MetricGateError('%s: %s comparison without a reference window' % (spec.name, spec.compare))
        ev['reference'] = {'kind': spec.compare, 'expr': spec.reference_expr,
                           'window': spec.reference_window.as_dict(), 'series': [], 'value': None}
        try:
            rraw, warns = client.query_range(spec.reference_expr, spec.reference_window, step)
            ev['warnings'].extend(warns)
            reference = reduce_series(rraw, spec.reduce)
            ev['reference']['series'] = reference
            if not reference:
                problems.append('%s: no %s series for %s in %s..%s (nothing to compare with)' % (
                    spec.name, spec.compare, spec.reference_expr, iso(spec.reference_window.start),
                    iso(spec.reference_window.end)))
            for s in reference:
                if s['samples'] < spec.min_samples:
                    tied[len(problems)] = s['labels']
                    problems.append('%s: %d valid %s sample(s) for %s, at least %d required' % (
                        spec.name, s['samples'], spec.compare, _labels_text(s['labels']), spec.min_samples))
        except PrometheusError as exc:
            problems.append('%s: %s: %s' % (spec.name, spec.compare, exc))

    # Traffic count.
    if spec.count_expr:
        ev['count'] = {'expr': spec.count_expr, 'min': spec.min_count, 'value': None, 'at': iso(window.end)}
        try:
            craw, warns = client.query(spec.count_expr, window.end)
            ev['warnings'].extend(warns)
            vals = [_to_float((c.get('value') or [None, None])[1]) for c in craw]
            vals = [v for v in vals if math.isfinite(v)]
            if not vals:
                problems.append('%s: count_expr %s returned no value: no traffic recorded, so the window proves nothing'
                                % (spec.name, spec.count_expr))
            else:
                total = math.fsum(vals)
                ev['count']['value'] = total
                if spec.min_count is not None and total < spec.min_count:
                    problems.append('%s: %s transaction(s) in the window, at least %s required (a quiet canary '
                                    'proves nothing)' % (spec.name, _fmt(total), _fmt(spec.min_count)))
        except PrometheusError as exc:
            problems.append('%s: count_expr: %s' % (spec.name, exc))

    # Comparison, only over series that have a value.
    pairs = []  # type: List[Tuple[float, float, str, Dict[str, str]]]
    if spec.compare == 'limit':
        limit = spec.limit if spec.limit is not None else 0.0
        for s in observed:
            if s['value'] is not None:
                pairs.append((s['value'], limit, ' for ' + _labels_text(s['labels']), s['labels']))
    elif spec.compare == 'baseline':
        ref_by_key = {_key(s['labels']): s for s in reference}
        obs_by_key = {_key(s['labels']): s for s in observed}
        for k, s in obs_by_key.items():
            r = ref_by_key.get(k)
            if r is None:
                if reference:
                    tied[len(problems)] = s['labels']
                    problems.append('%s: series %s has no baseline series with the same labels'
                                    % (spec.name, _labels_text(s['labels'])))
                continue
            if s['value'] is not None and r['value'] is not None:
                pairs.append((s['value'], r['value'], ' for ' + _labels_text(s['labels']), s['labels']))
        if observed:
            for k, r in ref_by_key.items():
                if k not in obs_by_key:
                    tied[len(problems)] = r['labels']
                    problems.append('%s: series %s is in the baseline but missing in the observation window '
                                    '(lost telemetry)' % (spec.name, _labels_text(r['labels'])))
    else:  # control
        if len(observed) > 1 or len(reference) > 1:
            problems.append('%s: a control comparison needs one series on each side (got %d observed, %d control); '
                            'aggregate with sum() or avg()' % (spec.name, len(observed), len(reference)))
        elif observed and reference and observed[0]['value'] is not None and reference[0]['value'] is not None:
            pairs.append((observed[0]['value'], reference[0]['value'], '', {}))
    word = {'limit': 'limit', 'baseline': 'baseline', 'control': 'control'}[spec.compare]
    allowed = []
    for obs, ref, where, labels in pairs:
        low, high = spec.bounds(ref)
        allowed.append({'reference': ref, 'low': low, 'high': high, 'value': obs})
        msg = _compare(spec, obs, ref, word, where)
        if msg:
            tied[len(problems)] = labels
            problems.append(msg)
    ev['allowed'] = allowed
    obs_vals = [s['value'] for s in observed if s['value'] is not None]
    ref_vals = [s['value'] for s in reference if s['value'] is not None]
    if obs_vals:
        ev['observed']['value'] = _worst(obs_vals, spec.direction)
    if ref_vals and ev['reference'].get('kind') != 'limit':
        ev['reference']['value'] = _worst(ref_vals, spec.direction)
    ev['problems'] = problems
    ev['passed'] = not problems
    owners = spec.expect_label or attribute
    if owners is not None:
        ev['by_node'] = attribute_problems(problems, tied, owners[0], tuple(owners[1]))
    return ev


def _worst(values: List[float], direction: str) -> float:
    return min(values) if direction == 'lower_is_worse' else max(values)


def run_gate(client: PrometheusClient, specs: List[QuerySpec], window: Window, step: float,
             nodes: Optional[List[str]] = None, node_label: str = 'Hostname') -> Dict[str, Any]:
    """Evaluate every query; the verdict is conjunctive over the critical ones.

    With `nodes`, each query's evidence has `by_node` (its series' problems go to the node their
    `node_label` names, the others to every node) and the verdict has `failed_nodes`: the nodes with a
    problem in a critical query."""
    if not specs:
        raise MetricGateError('queries: declare at least one query or preset')
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise MetricGateError('queries: duplicate name(s) %s' % ', '.join(dupes))
    attribute = (node_label, tuple(nodes)) if nodes else None
    results = [evaluate_query(client, s, window, step, attribute) for s in specs]
    failed_critical = [r['name'] for r in results if not r['passed'] and r['critical']]
    failed_other = [r['name'] for r in results if not r['passed'] and not r['critical']]
    problems = [p for r in results if r['critical'] for p in r['problems']]
    noncritical = ['non-critical: ' + p for r in results if not r['critical'] for p in r['problems']]
    passed = not failed_critical
    if passed:
        msg = 'metric gate: PASS (%d quer%s over %s..%s%s)' % (
            len(results), 'y' if len(results) == 1 else 'ies', iso(window.start), iso(window.end),
            '; non-critical failed: ' + ', '.join(failed_other) if failed_other else '')
    else:
        msg = 'metric gate: FAIL: ' + '; '.join(problems)
    verdict = {
        'passed': passed, 'msg': msg, 'failed_critical': failed_critical, 'failed_noncritical': failed_other,
        'problems': problems, 'warnings': noncritical, 'window': dict(window.as_dict(), step=step),
        'queries': results,
    }
    if nodes:
        verdict['failed_nodes'] = [n for n in nodes
                                   if any(r['critical'] and r['by_node'].get(n, r['problems']) for r in results)]
    return verdict
