"""ascend-agent: a Kubernetes device plugin for Huawei Ascend NPUs."""

__version__ = "0.1.0"
