//go:build tools

// Package tools pins the upstream components of the test control plane (tests/cluster): they are
// built from these modules at the versions in go.mod/go.sum by tests/cluster/build.py, never
// downloaded as binaries.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
