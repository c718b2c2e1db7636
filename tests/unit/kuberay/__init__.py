"""docker/kuberay/ (docs/kuberay.md) checked without a Kubernetes cluster: every manifest
parses, the RayCluster has what the KubeRay CRD and operator require, the head offers Ray no
accelerators, every worker group's Ray GPUs are its pods' GPUs, the pdctl config in the
ConfigMap loads and fits the workers, the containers' pdctl commands parse with pdctl's own CLI
parser, the pods share the volumes the controller, the console and the engines need, the
Service reaches the head pod's ports, and the kustomization lists every manifest.

Each check is a function of the loaded manifests; ``test_check_catches`` breaks the manifests
one way per check (in memory) and expects that check to fail.

The KubeRay facts encoded here were read from KubeRay v1.7.0 (github.com/ray-project/kuberay,
tag ``v1.7.0``, commit 59d663aeec13760646da3db9c1cf8cfe883e30b7): the CRD
``ray-operator/config/crd/bases/ray.io_rayclusters.yaml`` (schema of version ``v1``), the
operator's ``ray-operator/controllers/ray/utils/validation.go`` and
``ray-operator/controllers/ray/common/pod.go``. Nothing of them is copied into this repository.

The package: ``manifests`` (the files, the KubeRay facts and the helpers that read them),
``cluster_checks`` (the RayCluster as KubeRay reads it), ``pod_checks`` (the pods as pdctl
needs them), ``test_files`` (the files themselves) and ``test_checks`` (each check passes,
and fails on a manifest broken its way).
"""
