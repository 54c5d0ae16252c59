"""torchkiln test stand-in for torchvision."""
