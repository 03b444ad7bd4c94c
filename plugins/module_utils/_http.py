# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on the controller.
"""One HTTP GET for the modules that read an HTTP API other than Kubernetes' (Prometheus for
metric_gate, AWX for awx_approval_info), through Ansible's ``open_url`` (its TLS options).

``http_get`` returns ``(status, body)``, an HTTP error answer included (its status and body, not an
exception), so each caller decides what a status means. A timeout or a connection that fails raises
as ``open_url`` raises it (``socket.timeout``/``TimeoutError``, ``URLError``, ``OSError``).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple
from urllib.error import HTTPError

from ansible.module_utils.urls import open_url

__all__ = ['http_get']


def http_get(url: str, headers: Dict[str, str], timeout: float, validate_certs: bool = True,
             ca_path: Optional[str] = None, follow_redirects: str = 'urllib2') -> Tuple[int, bytes]:
    """GET `url`: (status, body); `follow_redirects` as open_url's ('none': a redirect is its 3xx status)."""
    try:
        resp = open_url(url, method='GET', headers=headers, timeout=timeout, validate_certs=validate_certs,
                        ca_path=ca_path, follow_redirects=follow_redirects)
        return resp.getcode(), resp.read()
    except HTTPError as exc:
        return exc.code, exc.read() or b''
