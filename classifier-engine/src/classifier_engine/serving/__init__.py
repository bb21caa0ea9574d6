"""An exported model behind HTTP (LitServe): answers as ``predict`` gives them, batched dynamically."""
