"""Studies: controlled comparisons of spec variants."""
