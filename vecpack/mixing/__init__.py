"""Mixtures: several sources by weight, chosen as whole documents, packed together."""
