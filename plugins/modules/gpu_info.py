#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_info
short_description: Read NVIDIA GPU, driver, Xid and driver-package facts of a GPU node
version_added: 0.1.0
author:
  - gpufleet.upgrade contributors (@gpufleet)
description:
  - Reads the driver and CUDA driver versions, the kernel release and loaded NVIDIA kernel modules with
    their reference counts, and per GPU its index, UUID, name, bus id, PCI identity
    C(vendor:device/subvendor:subdevice), MIG mode, ECC mode and counts, retired pages pending,
    remapped rows, temperature and running compute processes.
  - Reads Xid events from the kernel log since boot or a given time, each with the catalog mnemonic and
    severity, and lists the installed driver-related packages.
  - Reads the machine's DMI identity (system vendor, product name, board vendor and name, from
    C(<sys_path>/class/dmi/id)), which the upgrade plan takes as the node's server platform where no
    C(gpufleet.io/platform) or C(node.kubernetes.io/instance-type) label names it.
  - Uses the C(nvidia-ml-py) binding (C(import pynvml)) when it is installed, else C(nvidia-smi -q -x).
  - An NVML call that fails on one GPU (not supported, GPU lost) leaves that field V(null) and records the
    NVML error text in the GPU's RV(gpus[].errors); it does not fail the task.
  - Read-only; it changes no GPU setting.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  backend:
    description:
      - Where GPU facts come from. V(auto) uses the binding when it imports, else C(nvidia-smi).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  kernel_log:
    description:
      - Where Xid events are read from. V(journal) runs C(journalctl -k), V(dmesg) runs C(dmesg), an
        absolute path reads that file (for example C(/var/log/kern.log)), V(none) skips Xid events.
    type: str
    default: journal
  xid_since:
    description:
      - Report Xid events at or after this time. V(boot) (the current boot), an RFC 3339 time such as
        V(2026-08-10T14:00:00Z), V(@<epoch seconds>), or a duration back from now such as V(30m), V(24h), V(7d).
      - Log lines that carry no time (plain C(dmesg) without boot time) are always reported.
    type: str
    default: boot
  packages:
    description:
      - Also list the installed driver-related packages (C(dpkg-query) or C(rpm)).
    type: bool
    default: true
  sys_path:
    description:
      - The sysfs root (an absolute path) the DMI identity is read under (C(class/dmi/id/sys_vendor), C(product_name), C(board_vendor),
        C(board_name)); another directory with that layout stands in for it (a test, a lab, a chroot).
      - A field that cannot be read (no DMI tables, a file missing or not readable) is V(null) in RV(dmi); it does not
        fail the task.
    type: path
    default: /sys
  require_driver:
    description:
      - When V(true), fail if NVML or C(nvidia-smi) cannot talk to the driver (for example the driver is not
        loaded). When V(false), return the other facts with no GPUs and the reason in RV(errors).
    type: bool
    default: true
requirements:
  - nvidia-ml-py (the C(pynvml) module) on the node, or the NVIDIA driver's C(nvidia-smi)
notes:
  - Runs on the GPU node (Python 3.9 or later).
seealso:
  - module: gpufleet.upgrade.driver_unload
"""

EXAMPLES = r"""
---
- name: Read GPU facts
  gpufleet.upgrade.gpu_info:
  register: gpu

- name: Stop when a critical Xid was logged since boot
  ansible.builtin.assert:
    that:
      - gpu.xid_events | selectattr('severity', 'equalto', 'critical') | list | length == 0
    fail_msg: "critical Xid events: {{ gpu.xid_events | map(attribute='raw') | list }}"

- name: Xid events of the last 24 hours from syslog, through nvidia-smi
  gpufleet.upgrade.gpu_info:
    backend: nvidia-smi
    kernel_log: /var/log/kern.log
    xid_since: 24h
    packages: false

- name: The DMI identity from a copy of a node's /sys/class/dmi/id tree (under /srv/fake-sys/class/dmi/id)
  gpufleet.upgrade.gpu_info:
    sys_path: /srv/fake-sys
    kernel_log: none
    packages: false

- name: Facts while the driver is unloaded (mid-upgrade)
  gpufleet.upgrade.gpu_info:
    require_driver: false
    kernel_log: none
"""

RETURN = r"""
backend:
  description: The backend that answered.
  returned: success
  type: str
  sample: nvml
driver_version:
  description: Driver version, V(null) when it could not be read.
  returned: success
  type: str
  sample: 580.126.20
cuda_driver_version:
  description: Highest CUDA version the driver supports.
  returned: success
  type: str
  sample: "13.0"
kernel:
  description: Running kernel release.
  returned: success
  type: str
  sample: 6.8.0-134-generic
modules:
  description: Loaded NVIDIA driver-stack kernel modules (from C(/proc/modules)).
  returned: success
  type: list
  elements: dict
  sample: [{name: nvidia, refcount: 12, used_by: [nvidia_uvm, nvidia_modeset]}]
pci_ids:
  description: Sorted unique PCI identities of the GPUs, C(vendor:device/subvendor:subdevice).
  returned: success
  type: list
  elements: str
  sample: ["10de:2330/10de:16c1"]
gpus:
  description: One entry per GPU, in NVML index order.
  returned: success
  type: list
  elements: dict
  contains:
    index: {description: NVML index., type: int}
    uuid: {description: GPU UUID., type: str}
    name: {description: Product name., type: str}
    bus_id: {description: PCI bus id., type: str, sample: "00000000:17:00.0"}
    pci_id: {description: PCI identity (lowercase hex)., type: str, sample: "10de:2330/10de:16c1"}
    mig_mode: {description: "MIG mode, C(current) and C(pending) booleans (V(null) when not supported).", type: dict}
    ecc:
      description: >-
        ECC C(enabled) and the C(volatile_uncorrected), C(aggregate_uncorrected), C(volatile_corrected),
        C(aggregate_corrected) counts (V(null) with ECC disabled or unsupported).
      type: dict
    retired_pages_pending: {description: Pages waiting for retirement at the next reset., type: bool}
    remapped_rows:
      description: C(correctable), C(uncorrectable), C(pending), C(failure) (Ampere and later), else V(null).
      type: dict
    temperature_c: {description: GPU temperature in Celsius., type: int}
    processes:
      description: Running compute processes, C(pid), C(name), C(used_memory_mib).
      type: list
      elements: dict
    errors:
      description: Field name to the NVML error text for every call that failed on this GPU.
      type: dict
      sample: {remapped_rows: Not Supported}
xid_events:
  description: >-
    Xid events from the kernel log since O(xid_since), in log order: C(time) (RFC 3339 UTC or V(null)),
    C(pci), C(code), C(mnemonic), C(description), C(action), C(severity) (critical, high, medium, low, unknown),
    C(gpu_index) (the GPU with that PCI address, if any) and the C(raw) line.
  returned: success
  type: list
  elements: dict
  sample:
    - time: "2026-08-10T14:03:22Z"
      pci: "0000:17:00"
      code: 79
      mnemonic: GPU_HAS_FALLEN_OFF_THE_BUS
      description: GPU has fallen off the bus
      action: RESTART_BM
      severity: critical
      gpu_index: 0
      raw: "NVRM: Xid (PCI:0000:17:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
packages:
  description: Installed driver-related packages and their versions.
  returned: success
  type: list
  elements: dict
  sample: [{name: nvidia-driver-580-server, version: 580.126.20-0ubuntu1}]
dmi:
  description:
    - The machine's DMI identity, each field's text (stripped) or V(null) where it could not be read or is empty.
    - M(gpufleet.upgrade.upgrade_plan)'s C(platform) of a node without a C(gpufleet.io/platform) or
      C(node.kubernetes.io/instance-type) label is C(<sys_vendor> <product_name>), else C(<board_vendor> <board_name>)
      where the product name is empty or a firmware placeholder (V(To Be Filled By O.E.M.), V(Default string)), else
      V(unknown).
  returned: success
  type: dict
  contains:
    sys_vendor: {description: System vendor., type: str}
    product_name: {description: System product name., type: str}
    board_vendor: {description: Baseboard vendor., type: str}
    board_name: {description: Baseboard product name., type: str}
  sample: {sys_vendor: Supermicro, product_name: SYS-821GE-TNHR, board_vendor: Supermicro, board_name: X13DEG-OAD}
errors:
  description: Host-level failures that did not fail the task (C(backend), C(driver_version), C(cuda_driver_version)).
  returned: success
  type: dict
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost, _nvml, _platform, _xid


def main():
    module = AnsibleModule(
        argument_spec=dict(
            backend=dict(type='str', default='auto', choices=list(_nvml.BACKENDS)),
            kernel_log=dict(type='str', default='journal'),
            xid_since=dict(type='str', default='boot'),
            packages=dict(type='bool', default=True),
            require_driver=dict(type='bool', default=True),
            sys_path=dict(type='path', default='/sys'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    kernel_log = p['kernel_log']
    if kernel_log in ('none', ''):
        kernel_log = None
    elif kernel_log not in ('journal', 'dmesg') and not kernel_log.startswith('/'):
        module.fail_json(msg="kernel_log=%r: expected journal, dmesg, none or an absolute file path" % kernel_log)
    if not p['sys_path'].startswith('/'):
        module.fail_json(msg="sys_path=%r: expected an absolute directory path (the sysfs root, /sys)" % p['sys_path'])
    try:
        facts = _nvml.collect_facts(backend=p['backend'], runner=_gpuhost.ModuleRunner(module),
                                    kernel_log=kernel_log, xid_since=p['xid_since'],
                                    packages=p['packages'], require_driver=p['require_driver'])
    except _nvml.MissingBackend as e:
        module.fail_json(msg=missing_required_lib('nvidia-ml-py', reason='to read GPU facts (%s)' % e),
                         exception=None if _nvml.HAS_PYNVML else str(_nvml.PYNVML_IMPORT_ERROR))
    except _xid.SinceError as e:
        module.fail_json(msg=str(e))
    except (_nvml.BackendError, _gpuhost.HostError) as e:
        module.fail_json(msg=str(e))
    except Exception as e:  # a defect, not a user error: keep the trace for -vvv
        module.fail_json(msg='gpu_info failed unexpectedly: %s' % e, exception=traceback.format_exc())
    facts['dmi'] = _platform.read_dmi(p['sys_path'])
    module.exit_json(changed=False, **facts)


if __name__ == '__main__':
    main()
