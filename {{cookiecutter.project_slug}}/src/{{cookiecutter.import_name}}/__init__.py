"""An image classifier trained with PyTorch Lightning on {% if cookiecutter.dataset == 'images' %}your own photos{% else %}CIFAR{% endif %}."""
