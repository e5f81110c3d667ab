"""SNLI (paper Table 3): frozen DistilBERT features with Transformer vs Grassmann–Plücker heads."""
