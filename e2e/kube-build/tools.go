//go:build tools

// Package tools pins the control-plane and node commands e2e/build.sh compiles. The build tag keeps this
// file out of every build; it exists so that `go mod tidy` records their dependencies in go.sum
// (kubectl is built only when none is on PATH).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
