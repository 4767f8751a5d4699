//go:build tools

// Package tools pins the kubelet for the lab's real node (bins/build-kubelet.sh; built, never imported).
package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
