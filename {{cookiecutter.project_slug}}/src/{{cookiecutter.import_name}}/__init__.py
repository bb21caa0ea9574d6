"""{{ cookiecutter.project_name }}: an image classifier trained with PyTorch Lightning."""
