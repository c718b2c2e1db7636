"""The controller's HTTP surface: ``create_app`` and its routes."""

from controller.api.app import create_app

__all__ = ["create_app"]
