# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """Options shared by gpu_operator_info and gpu_operator_update (OPERATOR_ARG_SPEC in _gpu_operator.py)."""

    DOCUMENTATION = r"""
options:
  namespace:
    description: Namespace of the operator and its operands.
    type: str
    default: gpu-operator
  cluster_policy:
    description: Name of the ClusterPolicy. Default - the only one (several fail the task).
    type: str
  manage:
    description:
      - How the operator is deployed. V(auto) - its HelmChart when O(helm_chart_name) exists in
        O(helm_chart_namespace), else the ClusterPolicy; V(helm_chart) requires the HelmChart;
        V(cluster_policy) ignores any HelmChart.
    type: str
    choices: [auto, helm_chart, cluster_policy]
    default: auto
  helm_chart_name:
    description: Name of the operator's RKE2 HelmChart.
    type: str
    default: gpu-operator
  helm_chart_namespace:
    description: Namespace of the HelmChart (RKE2's helm-controller watches C(kube-system)).
    type: str
    default: kube-system
"""
