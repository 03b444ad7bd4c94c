# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """Options shared by kernel_check and kernel_packages (KERNEL_ARG_SPEC in _kernel_args.py)."""

    DOCUMENTATION = r"""
options:
  kernel:
    description:
      - The target kernel release as C(uname -r) prints it, for example V(6.8.0-135-generic), or on the RHEL family
        V(5.14.0-427.16.1.el9_4.x86_64).
    type: str
    required: true
  branch:
    description:
      - The NVIDIA driver branch, for example V(580).
    type: str
    required: true
  driver_version:
    description:
      - The target driver (upstream) version, for example V(580.130.00). It must be in O(branch).
    type: str
    required: true
  module_source:
    description:
      - How the NVIDIA kernel modules reach the kernel.
      - V(dkms) builds them with C(nvidia-dkms-<branch>-server) for every kernel whose C(linux-headers-<kernel>) is
        installed (driver user space preset C(ubuntu-server)).
      - V(prebuilt) uses Canonical's signed C(linux-modules-nvidia-<branch>-server-<kernel>), one package per kernel
        ABI, with the C(nvidia-headless-no-dkms-<branch>-server) user space (preset C(ubuntu-server-prebuilt)).
      - On the RHEL family, V(dkms) is C(kernel-devel-<kernel>) with C(kmod-nvidia-open-dkms) and V(prebuilt) is NVIDIA's
        precompiled C(kmod-nvidia-open-<driver>-<kver>-<krel>).
      - Must match the installed packages; switching source is refused.
    type: str
    required: true
    choices: [dkms, prebuilt]
  previous_kernel:
    description:
      - The kernel to keep as the way back. Default is the running kernel (read from O(proc_path)) when it differs
        from O(kernel).
    type: str
  previous_driver_version:
    description:
      - The driver version to keep as the way back. Default is the upstream version of the installed
        C(nvidia-kernel-common-<branch>-server).
    type: str
  check_way_back:
    description:
      - Also check that the previous driver has modules for the previous kernel on the node (the DKMS build, or the
        prebuilt module package at the version for that driver), and that a rollback can reinstall them from the
        repositories.
    type: bool
    default: true
  installroot:
    description:
      - Operate on the system under this directory instead of C(/). apt and dpkg (dnf and rpm on the RHEL family, whose
        plugins' configuration is then read under it too) read and write only under it.
    type: path
  proc_path:
    description:
      - Where C(/proc) is, for the running kernel (C(sys/kernel/osrelease)).
    type: path
    default: /proc
  update_cache:
    description:
      - Run C(apt-get update) (C(dnf makecache) on the RHEL family) before reading what the repositories offer (not in
        check mode).
    type: bool
    default: false
"""
