"""Everything that speaks the kubelet's device plugin API: one lifecycle per resource, its service, the wire
bytes, and registration."""
