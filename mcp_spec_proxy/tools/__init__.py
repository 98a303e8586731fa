"""The catalog: public names, classification, argument checks, fingerprints, look-alikes and tool search."""
