//go:build tools

// Package tools pins NVIDIA's GPU Operator for the tests (tests/cluster/gpuoperator.py): built from
// this module at the version in go.mod/go.sum by tests/cluster/build.py (`--gpu-operator`), never
// downloaded as a binary. Its assets, manifests and CRDs are read from the same module's source in
// the Go module cache. A separate module from ../go because its Kubernetes libraries are older than
// the control plane's.
package tools

import _ "github.com/NVIDIA/gpu-operator/cmd/gpu-operator"
