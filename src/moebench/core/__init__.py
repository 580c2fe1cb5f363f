"""The harness core: the GPU timer, the way of measuring, metrics and what bounds them, the machine's
fingerprint and memory ceilings, provenance, atomic files, ports and staged site folders. It imports
no other layer of moebench."""
