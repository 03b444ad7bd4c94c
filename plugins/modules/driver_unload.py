#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: driver_unload
short_description: Stop host GPU clients and unload the NVIDIA kernel modules safely
version_added: 0.1.0
author:
  - gpufleet.upgrade contributors (@gpufleet)
description:
  - Stops the host GPU client services that are active (O(services) plus O(extra_services)) with C(systemctl stop).
  - Finds every process that holds a C(/dev/nvidia*) device (by scanning C(/proc/*/fd)). A holder that does not
    belong to one of the services being stopped makes the module fail before anything is changed, naming the
    processes, unless O(kill_holders=true).
  - Unloads the loaded NVIDIA modules in the order C(nvidia_drm), C(nvidia_modeset), C(nvidia_uvm),
    C(nvidia_peermem), C(nvidia_fs), C(nvidia_vgpu_vfio), C(gdrdrv), C(nvidia) with C(rmmod), skipping those
    not loaded (the order of NVIDIA's k8s-driver-manager; C(nvidia_drm) first because it holds C(nvidia_modeset)).
  - Drain the node of GPU workloads first (for example with the collection's drain); this module only deals with
    what runs on the host.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.mutating
attributes:
  check_mode:
    details:
      - Reports the plan (RV(plan)) and fails on blocking holders as the real run would.
  diff_mode:
    details:
      - Active client services and loaded NVIDIA modules before and after.
  idempotent:
    description: With the services stopped and no module loaded, a second run changes nothing.
options:
  services:
    description:
      - Host GPU client services to stop when active. Services that are not installed are skipped.
    type: list
    elements: str
    default: [nvidia-persistenced, nvidia-fabricmanager, nvidia-dcgm, dcgm, dcgm-exporter]
  extra_services:
    description:
      - More services to stop, after O(services) (for example C(nvsm), C(nv_peer_mem), a site agent).
    type: list
    elements: str
    default: []
  kill_holders:
    description:
      - Send SIGTERM (then SIGKILL after O(kill_timeout) seconds) to processes that still hold C(/dev/nvidia*)
        once the services are stopped. Off by default; the module never kills a process unless this is V(true).
    type: bool
    default: false
  kill_timeout:
    description:
      - Seconds to wait for holders to exit after SIGTERM before SIGKILL. Between 1 and 600.
    type: int
    default: 30
  proc_root:
    description:
      - Where the host's C(/proc) is mounted (for example C(/host/proc) when run from a privileged container).
    type: path
    default: /proc
notes:
  - Needs root. Runs on the GPU node (Python 3.9 or later).
seealso:
  - module: gpufleet.upgrade.gpu_info
"""

EXAMPLES = r"""
---
- name: Show what an unload would do
  gpufleet.upgrade.driver_unload:
  check_mode: true
  register: unload_plan

- name: Unload the driver, also stopping a monitoring agent
  gpufleet.upgrade.driver_unload:
    extra_services: [nvsm, site-gpu-agent]
  become: true

- name: Unload even if a stray process still holds a GPU (it is killed)
  gpufleet.upgrade.driver_unload:
    kill_holders: true
    kill_timeout: 60
  become: true
"""

RETURN = r"""
plan:
  description:
    - What the module does or would do. C(stop_services) (active services to stop), C(released_by_stop) (holders
      that belong to those services), C(kill) (holders to kill), C(blocking) (holders that prevent the unload),
      C(unload_modules) (loaded modules in unload order).
  returned: always
  type: dict
  sample:
    stop_services: [nvidia-persistenced, nvidia-fabricmanager]
    released_by_stop:
      - {pid: 2101, comm: nvidia-persiste, cmdline: /usr/bin/nvidia-persistenced --user nvidia-persistenced,
         unit: nvidia-persistenced.service, devices: [/dev/nvidia0, /dev/nvidiactl]}
    kill: []
    blocking: []
    unload_modules: [nvidia_modeset, nvidia_uvm, nvidia]
holders:
  description: Processes found holding C(/dev/nvidia*) (C(pid), C(comm), C(cmdline), C(unit), C(devices)).
  returned: always
  type: list
  elements: dict
services_stopped:
  description: Services stopped by this run, in order.
  returned: always
  type: list
  elements: str
  sample: [nvidia-persistenced, nvidia-fabricmanager]
killed:
  description: PIDs of holders killed by this run (only with O(kill_holders=true)).
  returned: always
  type: list
  elements: int
modules_unloaded:
  description: Modules unloaded by this run, in order.
  returned: always
  type: list
  elements: str
  sample: [nvidia_modeset, nvidia_uvm, nvidia]
"""

import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost, _unload


def main():
    module = AnsibleModule(
        argument_spec=dict(
            services=dict(type='list', elements='str', default=list(_unload.DEFAULT_SERVICES)),
            extra_services=dict(type='list', elements='str', default=[]),
            kill_holders=dict(type='bool', default=False),
            kill_timeout=dict(type='int', default=30),
            proc_root=dict(type='path', default='/proc'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not 1 <= p['kill_timeout'] <= 600:
        module.fail_json(msg='kill_timeout=%d: expected 1 to 600 seconds' % p['kill_timeout'])
    for field in ('services', 'extra_services'):
        for name in p[field]:
            if not name or name.startswith('-') or '/' in name or ' ' in name:
                module.fail_json(msg='%s: %r is not a systemd unit name' % (field, name))
    services = list(dict.fromkeys(p['services'] + p['extra_services']))
    try:
        result = _unload.execute(_gpuhost.ModuleRunner(module), services, kill_holders=p['kill_holders'],
                                 kill_timeout=p['kill_timeout'], check_mode=module.check_mode,
                                 proc_root=p['proc_root'])
    except _unload.UnloadError as e:
        details = dict(e.details)
        details.pop('diff', None)
        details['changed'] = bool(details.get('services_stopped') or details.get('killed')
                                  or details.get('modules_unloaded'))
        module.fail_json(msg=str(e), **details)
    except _gpuhost.HostError as e:
        module.fail_json(msg=str(e))
    except Exception as e:  # a defect, not a user error: keep the trace for -vvv
        module.fail_json(msg='driver_unload failed unexpectedly: %s' % e, exception=traceback.format_exc())
    diff = result.pop('diff')
    if module._diff:
        result['diff'] = diff
    module.exit_json(**result)


if __name__ == '__main__':
    main()
