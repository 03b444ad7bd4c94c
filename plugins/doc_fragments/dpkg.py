# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """What driver_pin and kernel_packages do with a dpkg database another process holds or left half-done."""

    DOCUMENTATION = r"""
options: {}
notes:
  - "apt: before any change, a dpkg database that holds an unfinished transaction (a journal left in
    C(/var/lib/dpkg/updates) by a killed dpkg, or packages C(dpkg --audit) lists as unpacked but not configured) fails
    the task naming it, with nothing changed. The module does not run C(dpkg --configure -a): it cannot tell
    another tool's or an operator's half-done transaction from its own killed run, so it does not finish one it did
    not start. Each apt write waits at most 300 seconds for the dpkg lock another process holds (C(apt-get) with
    C(DPkg::Lock::Timeout), C(apt-mark) retried), then fails naming the holder."
"""
