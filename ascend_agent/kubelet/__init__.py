"""Everything that faces the kubelet: the device plugins (:mod:`.deviceplugin`), the DRA driver in their place
(:mod:`.dra`), the kubelet's PodResources view (:mod:`.podresources`, :mod:`.holders`, :mod:`.handed_out`),
the health each of its IDs shows under ``--volcano`` (:mod:`.mounted`), its own directories (:mod:`.dirs`)
and a stand-in for development (:mod:`.sim`)."""
