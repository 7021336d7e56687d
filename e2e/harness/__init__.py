"""A local Kubernetes control plane for the e2e tier, run as plain processes on loopback.

There is no container engine on the machines this suite runs on, so instead of kind the harness
starts the real binaries built by ``e2e/build.sh``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK (which plays the kubelet for fake nodes, so pods get scheduled and reach
``Running`` without running anything). Every server listens on a free 127.0.0.1 port, every file
lives in one temporary directory, readiness is awaited by condition with a deadline, and every
process is stopped by its PID.

``Kube`` is the thin client the tests use: it drives the same ``kubectl`` a user would, so a test
of "``kubectl apply`` of a bad spec fails with a clear message" asserts exactly what users see.

One module per component: ``process`` (binaries, logs, waits, stop by PID), ``pki``
(certificates and kubeconfig), ``kwok`` (fake nodes and volumes), ``control_plane`` (the
servers and their start order), ``kube`` (the client) and ``operator`` (``delayq operator`` as a
local process); and for the tests' topics: ``topics`` (a DelayTopic as the API server shows
it), ``dataplane`` (its brokers and ``delayq serve`` run locally), ``receiver`` (a loopback
webhook endpoint) and ``metrics`` (Prometheus samples); for the modules on real pods:
``node`` (the real kubelet) and ``real_release`` (the chart installed on it).
"""
