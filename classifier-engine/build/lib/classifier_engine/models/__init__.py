"""Services on a trained network: its cost (FLOPs, parameters), class activation maps, training totals."""
