# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """Shared `attributes` documentation (check mode, diff mode, idempotency)."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
"""

    # Read-only modules and gates.
    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - This action does not modify state.
  diff_mode:
    support: N/A
    details:
      - This action does not modify state.
  idempotent:
    support: full
    description: Running the module twice with the same input gives the same result.
"""

    # Modules that change the node or a file: check mode and diff mode in full, idempotent. A
    # module adds its own diff_mode details and may say how it is idempotent.
    MUTATING = r"""
options: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
    description: Running the module twice with the same input gives the same result.
"""
