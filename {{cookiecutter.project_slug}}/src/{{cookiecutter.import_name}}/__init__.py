"""An image classifier trained with PyTorch Lightning on CIFAR."""
