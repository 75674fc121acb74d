"""Training algorithms (ssgd, ssd, odsgd, localsgd) and the single-process reference simulator."""
