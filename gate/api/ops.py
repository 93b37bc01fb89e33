"""placeholder"""

from fastapi import APIRouter

router = APIRouter()
metrics_router = APIRouter()
